"""The settings every allocation decision depends on, in one value: granularity, the booking
TTL, whose pods are ours, and where the claims live. Built once from the settings; passed to
whatever decides."""

from __future__ import annotations

from dataclasses import dataclass

from rgpu_placement import Granularity

from .settings import AllocatorSettings

__all__ = ["Policy"]


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
