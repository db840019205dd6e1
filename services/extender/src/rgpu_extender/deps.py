"""The verbs need the same handful of clients and stores, opened once by
the lifespan; bundling them in one frozen value keeps each verb's signature short and lets the
routes reach them through a single typed accessor.
"""

from __future__ import annotations

from dataclasses import dataclass

from rgpu_runtime import EventRecorder, Settings

from .admission import AdmissionPolicy
from .allocator_client import AllocatorClient
from .apiserver import Apiserver
from .inventory import Inventory
from .metrics import ExtenderMetrics

__all__ = ["Deps"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """Everything a verb may use; built by the lifespan, read by handlers via ``deps()``."""

    settings: Settings
    allocator: AllocatorClient
    apiserver: Apiserver
    inventory: Inventory
    events: EventRecorder
    metrics: ExtenderMetrics
    admission: AdmissionPolicy

    @property
    def budget(self) -> float:
        """Seconds a verb may spend on downstream calls (``RGPU_EXTENDER_BUDGET_SECONDS``)."""
        return self.settings.scheduling.extender_budget_seconds
