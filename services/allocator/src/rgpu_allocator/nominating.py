"""A nomination is written to the Lease of the server freed for a pod, with compare-and-swap
like every claim, and read back from the ledger (``Nominations``: what a promise is made of and
how long it lasts, what an eviction would cost, where a pod is held to, and whether its victims
still hold the server). Writing it takes two edits. The first promises
the server unless someone holds a live promise there (this pod already: nothing more to do;
another pod that outranks it, or a pod that is not a victim took some of the promised cards
since the choice: taken). The second takes a pod's promise back when its victims could not
all go.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from rgpu_contracts import Claim, ServerName
from rgpu_placement import FleetView, Nomination, Preemption, Standing

from .claims import LeaseRecord
from .judging import Judge
from .leases import Edit, Edited
from .pods import PodInfo

__all__ = ["Nominations", "Step", "nominate", "withdraw"]


class Step(enum.Enum):
    """What ``nominate`` found on the Lease."""

    WRITTEN = "written"
    """The promise is written: evict the victims."""
    MINE = "mine"
    """The pod holds a live promise there already."""
    TAKEN = "taken"
    """Someone else holds it, or the Lease is gone: try another server."""


def nominate(nomination: Nomination) -> Edit[Step]:
    """Promise the server to the nominee unless someone holds a live promise there."""
    uid, priority, now = nomination.pod.uid, nomination.priority, nomination.nominated_at

    def change(record: LeaseRecord | None) -> Edited[Step]:
        held = record.nomination if record is not None else None
        if record is None:
            return Edited(None, Step.TAKEN)
        if held is not None and held.pod.uid == uid and now < held.expires_at:
            return Edited(None, Step.MINE)
        if held is not None and held.holds_against(uid, priority, now):
            return Edited(None, Step.TAKEN)
        if _newcomers(record, nomination):
            return Edited(None, Step.TAKEN)
        return Edited(record.claims, Step.WRITTEN, nomination=nomination)

    return change


def withdraw(uid: str) -> Edit[None]:
    """Take back ``uid``'s nomination (a Lease promising the server to another is left alone)."""

    def change(record: LeaseRecord | None) -> Edited[None]:
        held = record.nomination if record is not None else None
        if record is None or held is None or held.pod.uid != uid:
            return Edited(None, None)
        return Edited(record.claims, None, nomination=None)

    return change


def _newcomers(record: LeaseRecord, nomination: Nomination) -> bool:
    """Whether a pod that is not a victim took some of the promised cards since the choice."""
    expected = {v.uid for v in nomination.victims} | {nomination.pod.uid}
    cards = set(nomination.cards)
    return any(c.pod.uid not in expected and cards.intersection(c.cards) for c in record.claims)


@dataclass(frozen=True, slots=True, kw_only=True)
class Nominations:
    """The nominations the ledger holds, as the booking path and admission read them."""

    judge: Judge

    def nomination_for(self, pod: PodInfo, option: Preemption, ttl: float) -> Nomination:
        """The promise of ``option``'s server to ``pod``: it lasts the booking ``ttl`` plus the
        victims' longest grace period, the most their leaving can take."""
        now = self.judge.clock()
        graces = (self._grace(v.pod.uid) for v in option.victims)
        return Nomination(
            pod=pod.ref,
            priority=pod.priority,
            cards=tuple(c.id for c in option.fit.cards),
            victims=tuple(v.pod for v in option.victims),
            nominated_at=now,
            expires_at=now + ttl + max(graces, default=0.0),
        )

    def standing(self, claim: Claim) -> Standing | None:
        """What evicting ``claim``'s pod would cost: its priority and the run time lost."""
        pod = self.judge.pods.by_uid.get(claim.pod.uid)
        if pod is None or pod.uid != claim.pod.uid:
            return None
        started = pod.started_at
        ran = max(0.0, self.judge.clock() - started) if started is not None else 0.0
        return Standing(priority=pod.priority, run_seconds=ran)

    def nominated_on(self, uid: str, view: FleetView) -> ServerName | None:
        """The server ``uid`` is held to (``Judge.nominated_on``)."""
        return self.judge.nominated_on(uid, view)

    def victims_hold(self, server: ServerName) -> bool:
        """Whether a victim of the nomination on ``server`` still has a claim there."""
        record = self.judge.ledger.lease(server)
        found = record.nomination if record is not None else None
        if record is None or found is None:
            return False
        victims = {v.uid for v in found.victims}
        return any(c.pod.uid in victims for c in record.claims)

    def unevicted(
        self, uid: str, server: ServerName, asked: Collection[str] = ()
    ) -> tuple[Claim, ...]:
        """The claims on ``server`` of the victims ``uid``'s nomination there names that were
        not asked to leave yet (an eviction stopped half-way): not deleting, not finished,
        and not among ``asked`` (evicted a moment ago, the pod watch not yet told)."""
        record = self.judge.ledger.lease(server)
        found = record.nomination if record is not None else None
        if record is None or found is None or found.pod.uid != uid:
            return ()
        victims = {v.uid for v in found.victims}.difference(asked)
        return tuple(c for c in record.claims if c.pod.uid in victims and self._stays(c))

    def _grace(self, uid: str) -> float:
        pod = self.judge.pods.by_uid.get(uid)
        return pod.grace_seconds if pod is not None else 0.0

    def _stays(self, claim: Claim) -> bool:
        pod = self.judge.pods.get(claim.pod.uid)
        return pod is not None and not pod.deleting and not pod.finished
