"""Allocating, committing, sweeping and repairing all work on the same
state (the ledger of Leases, the pod cache, the fleet) under the same policy; this is that
shared core, plus what an ``Allocation`` looks like (which of a pod's claims wins is
``rgpu_placement.winner``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rgpu_contracts import Allocation, Claim, PodUID
from rgpu_placement import FleetView, Granularity, Validity, expires_at
from rgpu_runtime import Settings

from .errors import FleetUnknown, NotSynced
from .inflight import KeyedLocks, Pending
from .inputs import Inputs
from .instruments import Instruments
from .kube_api import KubeApi
from .ledger import Ledger
from .occupancy import LeaseLookup, Occupancy
from .pods import PodIndex
from .wakeup import Refused
from .writing import LeaseWriter

__all__ = ["Core", "Policy"]


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
    def from_settings(cls, settings: Settings) -> Policy:
        s = settings.scheduling
        return cls(
            granularity=s.granularity,
            ttl=s.booking_ttl_seconds,
            scheduler_name=s.scheduler_name,
            namespace=s.namespace,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Core:
    """Everything decisions read and write, shared by the allocator's activities."""

    policy: Policy
    ledger: Ledger
    pods: PodIndex
    inputs: Inputs
    api: KubeApi
    writer: LeaseWriter
    instruments: Instruments
    refused: Refused
    on_capacity: Callable[[], None]
    """Called when cards were freed, so refused pods get nudged."""
    clock: Callable[[], float] = field(default=time.time)
    """Wall-clock seconds: claim times are compared across replicas."""
    pending: Pending = field(default_factory=Pending)
    """Bookings this replica is writing right now; they count as held meanwhile."""
    pod_locks: KeyedLocks = field(default_factory=KeyedLocks)
    """Requests for one pod go one at a time in a replica (the second finds the first's claim)."""

    def occupancy(self, uid: str, *, leases: LeaseLookup | None = None) -> Occupancy:
        """Who else holds what, for a decision about ``uid`` now."""
        view = self.inputs.view
        return Occupancy(
            leases or self.ledger.lease,
            self.pods,
            uid=PodUID(uid),
            now=self.clock(),
            ttl=self.policy.ttl,
            pending=self.pending.claims,
            released=self.ledger.released_after,
            observed_at=view.fleet.observed_at if view is not None else float("inf"),
        )

    def validity(self, claim: Claim) -> Validity:
        return self.occupancy(claim.pod.uid).validity(claim)

    def live(self, uid: str) -> tuple[Claim, ...]:
        """``uid``'s claims that still hold their cards."""
        return tuple(c for c in self.ledger.claims_of(uid) if self.validity(c).blocks)

    def require_view(self) -> FleetView:
        """The fleet to decide on; raises ``FleetUnknown`` before discovery delivered one."""
        view = self.inputs.view
        if view is None:
            reason = self.inputs.discovery_error or "no answer yet"
            raise FleetUnknown(f"no fleet from discovery yet ({reason}); retry shortly")
        return view

    def require_synced(self) -> None:
        """Raises ``NotSynced`` until pods and Leases have been listed once."""
        if not (self.pods.synced and self.ledger.synced):
            raise NotSynced("pods and claim Leases are still being listed; retry shortly")

    def allocation_of(
        self, claim: Claim, annotations: tuple[tuple[str, str], ...] = ()
    ) -> Allocation:
        """The API view of ``claim``."""
        view = self.inputs.view
        facts = view.facts.get(claim.server) if view is not None else None
        endpoint = facts.server.endpoint if facts is not None else None
        pod = self.pods.get(claim.pod.uid)
        return Allocation(
            pod=claim.pod,
            server=claim.server,
            endpoint=endpoint or "",
            cards=claim.cards,
            containers=claim.containers,
            state=claim.state,
            booked_at=claim.booked_at,
            expires_at=expires_at(claim, pod, self.policy.ttl),
            annotations=annotations,
        )
