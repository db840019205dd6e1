"""Whether a claim still holds its cards decides double-booking on one side and leaked servers
on the other; every activity asks it, on the same caches, under the same policy. The rule
itself is ``rgpu_placement.judge``; the ``Judge`` applies it to the allocator's caches (the
Lease ledger, the pod index, the fleet) at the current time, builds the ``Occupancy`` a
decision reads (``occupancy``), and says where a nomination holds a pod (a promised server is
a claim too, and it stops holding on its own rules: ``nominated_on``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rgpu_contracts import Claim, PodUID, ServerName
from rgpu_placement import FleetView, Nomination, Validity, judge
from rgpu_runtime.feeds import DiscoveryMirror

from .errors import FleetUnknown
from .ledger import Ledger
from .occupancy import Occupancy
from .pods import PodIndex, PodInfo
from .settled import Settled

__all__ = ["Judge", "Seen", "occupancy_of"]

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
    pending: Mapping[str, Mapping[PodUID, Claim]] = field(default_factory=dict)
    """Bookings this replica is writing right now, per server (``Pending.by_server``); they
    count as held meanwhile."""
    clock: Callable[[], float] = field(default=time.time)
    """Wall-clock seconds: claim times are compared across replicas."""
    pods_trusted: Callable[[], bool] = field(default=_always)
    """Whether the pod cache heard from the apiserver recently enough to drop claims on
    (docs/design.md#stale-caches-are-noticed)."""
    settled: Settled = field(default_factory=Settled)
    """Time-independent verdicts per server, shared by this replica's decisions."""

    def occupancy(
        self, uid: str, *, planned: Mapping[str, Mapping[PodUID, Claim]] | None = None
    ) -> Occupancy:
        """Who else holds what, for a decision about ``uid`` now (``planned``: the bookings an
        admission pass has planned so far, held besides those in flight)."""
        view = self.discovery.view
        return occupancy_of(
            self.ledger,
            self.pods,
            uid=uid,
            now=self.clock(),
            ttl=self.ttl,
            pending=self.pending,
            planned=planned,
            observed_at=view.fleet.observed_at if view is not None else math.inf,
            trusted=self.pods_trusted(),
            priority=self.priority_of(uid),
            settled=self.settled,
        )

    def view(self) -> FleetView:
        """The fleet to decide on; raises ``FleetUnknown`` before discovery delivered one."""
        discovery = self.discovery
        if discovery.view is None:
            reason = discovery.error or "no answer yet"
            raise FleetUnknown(f"no fleet from discovery yet ({reason}); retry shortly")
        return discovery.view

    def priority_of(self, uid: str) -> int:
        """The pod's priority as the cache has it (0 when unknown)."""
        pod = self.pods.by_uid.get(uid)
        return pod.priority if pod is not None else 0

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
        if uid not in self.ledger.holders:
            return ()  # most pods asked about hold nothing: no decision to build
        return self.occupancy(uid).mine()

    def nominated_on(
        self, uid: str, view: FleetView, held: Occupancy | None = None
    ) -> ServerName | None:
        """The server ``uid`` is held to: where it has a live nomination that still stands
        (judged on ``held``, the decision's occupancy, when given).

        Its booking goes there or nowhere, so no victim is evicted for a pod that then books
        elsewhere. A nomination stops standing when a pod that is not a victim holds some of
        its cards (one of higher priority may book over it), or when ``view`` says the server
        cannot take the pod whoever leaves (its Node not Ready, lupine not answering, a
        cordon, gone from the fleet): the victims' leaving can no longer free it, and the pod
        is free to look elsewhere (or preempt again).
        """
        now = held.now if held is not None else self.clock()
        live = [
            (server, found)
            for server, record in self.ledger.nominations.items()
            if (found := record.nomination) is not None
            and found.pod.uid == uid
            and now < found.expires_at
        ]
        if not live:
            return None
        # Only the newest counts: a pod whose server broke may have freed another, and the
        # first server back before the second's victims left must not take it from them.
        server, newest = max(live, key=lambda pair: pair[1].nominated_at)
        held = held if held is not None else self.occupancy(uid)
        return ServerName(server) if _stands(held, server, newest, view) else None


def occupancy_of(
    ledger: Ledger,
    pods: PodIndex,
    *,
    uid: str,
    now: float,
    ttl: float,
    pending: Mapping[str, Mapping[PodUID, Claim]] | None = None,
    planned: Mapping[str, Mapping[PodUID, Claim]] | None = None,
    observed_at: float = math.inf,
    trusted: bool = True,
    priority: int = 0,
    settled: Settled | None = None,
) -> Occupancy:
    """The ``Occupancy`` of a decision about ``uid``, read from ``ledger``'s and ``pods``'
    tables."""
    return Occupancy(
        uid=PodUID(uid),
        now=now,
        ttl=ttl,
        leases=ledger.by_server,
        pods=pods.by_uid,
        gone=pods.buried,
        pending=pending if pending is not None else {},
        planned=planned if planned is not None else {},
        holders=ledger.holders,
        releases=ledger.releases,
        observed_at=observed_at,
        trusted=trusted,
        priority=priority,
        settled=settled,
    )


def _stands(held: Occupancy, server: str, nomination: Nomination, view: FleetView) -> bool:
    facts = view.facts.get(ServerName(server))
    # A client lupine reports on a promised card does not end the hold: it is most often a
    # victim's, reported until discovery probes again, and leaving would waste its eviction.
    return facts is not None and facts.problem is None and not _overtaken(held, server, nomination)


def _overtaken(held: Occupancy, server: str, nomination: Nomination) -> bool:
    """Whether a pod that is not a victim holds some of the promised cards."""
    victims = {v.uid for v in nomination.victims}
    cards = set(nomination.cards)
    # Claims as written only: a booking still in flight was chosen before the promise was
    # read (its write re-fits on the Lease, where the promise keeps it off unless it outranks
    # the nominee). Counting it would free the nominee for a moment, long enough to preempt a
    # second server (a card soak: a victim evicted for nothing).
    written = held.written(server)
    return any(c.pod.uid not in victims and cards.intersection(c.cards) for c in written)
