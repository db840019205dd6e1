"""The settings every allocation decision depends on, in one value: granularity, the booking
TTL, whose pods are ours, and where the claims live (``Policy``); and what is done about a
lost server (``LostPolicy``). Built once from the settings; passed to whatever decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from rgpu_placement import Granularity
from rgpu_runtime.pacing import Backoff

from .settings import AllocatorSettings

__all__ = ["EVICTION_RETRY", "LostPolicy", "Policy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """The settings allocation decisions depend on."""

    granularity: Granularity
    ttl: float
    """Seconds an unbound booking (or commit) stays valid."""
    scheduler_name: str
    """Only pods of this scheduler are ever repaired from their annotations."""
    namespace: str
    """Where the claim Leases live."""

    @classmethod
    def from_settings(cls, settings: AllocatorSettings) -> Policy:
        s = settings.scheduling
        return cls(
            granularity=s.granularity,
            ttl=s.booking_ttl_seconds,
            scheduler_name=s.scheduler_name,
            namespace=s.namespace,
        )


EVICTION_RETRY: Final = Backoff(initial=1.0, maximum=60.0)
"""A budget that refuses now may allow in a second (a replica became Ready); a minute caps
the retries of a budget that stays shut."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LostPolicy:
    """How long a server may be lost before its holders are told, and what else happens."""

    grace: float
    evict: bool
    retry: Backoff = field(default_factory=lambda: EVICTION_RETRY)
    """Between evictions a PodDisruptionBudget refused (or the apiserver failed)."""

    @classmethod
    def from_settings(cls, settings: AllocatorSettings) -> LostPolicy:
        scheduling = settings.scheduling
        return cls(
            grace=scheduling.server_lost_grace_seconds,
            evict=scheduling.on_server_lost == "evict",
        )
