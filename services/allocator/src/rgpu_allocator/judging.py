"""Whether a claim still holds its cards decides double-booking on one side and leaked servers
on the other; every activity asks it, on the same caches, under the same policy. The rule
itself is ``rgpu_placement.judge``; the ``Judge`` applies it to the allocator's caches (the
Lease ledger, the pod index, the fleet) at the current time, and builds the ``Occupancy`` a
decision reads (``occupancy``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rgpu_contracts import Claim, PodUID
from rgpu_placement import FleetView, Validity, judge
from rgpu_runtime.feeds import DiscoveryMirror

from .ledger import Ledger
from .occupancy import LeaseLookup, Occupancy, PendingLookup, Settled
from .pending import Pending
from .pods import PodIndex, PodInfo

__all__ = ["Judge", "Seen"]

Seen = Mapping[PodUID, PodInfo | None]
"""Pods read fresh from the apiserver, by the uid their claim names (``None``: it is gone)."""


def _always() -> bool:
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Judge:
    """Verdicts on claims from the caches (Leases, pods, fleet) at the current time."""

    ledger: Ledger
    pods: PodIndex
    discovery: DiscoveryMirror[FleetView]
    ttl: float
    pending: Pending = field(default_factory=Pending)
    """Bookings this replica is writing right now; they count as held meanwhile."""
    clock: Callable[[], float] = field(default=time.time)
    """Wall-clock seconds: claim times are compared across replicas."""
    pods_trusted: Callable[[], bool] = field(default=_always)
    """Whether the pod cache heard from the apiserver recently enough to drop claims on
    (docs/design.md#stale-caches-are-noticed)."""
    settled: Settled = field(default_factory=Settled)
    """Time-independent verdicts per server, shared by this replica's decisions."""

    def occupancy(
        self,
        uid: str,
        *,
        leases: LeaseLookup | None = None,
        pending: PendingLookup | None = None,
    ) -> Occupancy:
        """Who else holds what, for a decision about ``uid`` now (``pending``: bookings in
        flight, this replica's by default)."""
        view = self.discovery.view
        return Occupancy(
            leases or self.ledger.lease,
            self.pods,
            uid=PodUID(uid),
            now=self.clock(),
            ttl=self.ttl,
            pending=self.pending.claims if pending is None else pending,
            released=self.ledger.released_after,
            observed_at=view.fleet.observed_at if view is not None else float("inf"),
            trusted=self.pods_trusted(),
            priority=self.priority_of(uid),
            holds=self._holds,
            settled=self.settled,
        )

    def priority_of(self, uid: str) -> int:
        """The pod's priority as the cache has it (0 when unknown)."""
        pod = self.pods.get(uid)
        return pod.priority if pod is not None else 0

    def _holds(self, uid: str) -> bool:
        return self.ledger.servers_of(uid) > 0

    def validity(self, claim: Claim, seen: Seen | None = None) -> Validity:
        """The verdict on ``claim`` now, from its pod as read fresh (``seen``) if it was, else
        from the pod cache."""
        uid = claim.pod.uid
        if seen is None or uid not in seen:
            return self.occupancy(uid).validity(claim)
        pod = seen[uid]
        if pod is None or pod.uid != uid:
            return Validity.INVALID
        return judge(claim, pod, now=self.clock(), ttl=self.ttl)

    def live(self, uid: str) -> tuple[Claim, ...]:
        """``uid``'s claims that still hold their cards."""
        return tuple(c for c in self.ledger.claims_of(uid) if self.validity(c).blocks)
