"""What the allocator knows — the policy, the claim ledger, the pod index, the claims it
publishes, the mirrored fleet and the instruments over them — built before any client exists,
so the registry the app is given can be scraped from the start.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from rgpu_placement import FleetView
from rgpu_runtime.feeds import DiscoveryMirror

from .instruments import Instruments
from .ledger import Ledger
from .pods import PodIndex
from .policy import Policy
from .published import PublishedClaims
from .settings import AllocatorSettings

__all__ = ["Memory"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """What the allocator knows, built before any client exists (metrics read it too)."""

    policy: Policy
    ledger: Ledger
    pods: PodIndex
    published: PublishedClaims
    discovery: DiscoveryMirror[FleetView]
    instruments: Instruments
    registry: CollectorRegistry

    @classmethod
    def create(cls, settings: AllocatorSettings, registry: CollectorRegistry) -> Memory:
        ledger, pods = Ledger(), PodIndex()
        discovery = DiscoveryMirror(
            FleetView.build, topology_keys=settings.scheduling.topology_keys
        )
        return cls(
            policy=Policy.from_settings(settings),
            ledger=ledger,
            pods=pods,
            published=PublishedClaims(),
            discovery=discovery,
            instruments=Instruments(registry, ledger=ledger, pods=pods, discovery=discovery),
            registry=registry,
        )
