"""While choosing a server for one pod, "which cards are held by someone else?" is asked of many
servers; ``Occupancy`` answers it from the Leases and the pod cache, judging each claim's
validity (``rgpu_placement.judge``) once per decision. It also says which of lupine's busy
reports still count. A card our own placed pod used is reported busy until discovery's next
probe after that pod is gone; if the pod's claim is invalid (finished, deleted) or the card was
released after the fleet was observed, that report is stale and ignored — otherwise a freed
server would stay refused for a probe interval. Busy cards no claim explains (clients placed
outside rgpu) always count.

A server being freed for an urgent pod (a live ``Nomination`` on its Lease) counts as held by
that pod for every pod of lower or equal priority, so nobody else books what the victims
leave behind; the nomination stops counting once the nominee holds a claim, is gone or
finished, or the nomination expires (docs/design.md §11).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rgpu_contracts import CardId, Claim, PodUID, card_id, split_card_id
from rgpu_placement import ServerFacts, Unclaimed, Validity, expires_at, judge, lasting

from .claims import LeaseRecord, placed
from .pods import PodIndex, PodInfo

__all__ = [
    "ClaimsGone",
    "HoldsLookup",
    "LeaseLookup",
    "Occupancy",
    "PendingLookup",
    "ReleaseLookup",
    "Settled",
]

LeaseLookup = Callable[[str], LeaseRecord | None]
"""Where a server's Lease is read from: the ledger, or a fresher copy during a write."""

PendingLookup = Callable[[str], tuple[Claim, ...]]
"""This replica's bookings still being written, per server (see ``pending.Pending``)."""

HoldsLookup = Callable[[str], bool]
"""Whether a pod (by uid) holds a claim anywhere: a nominee that booked needs no promise."""

ReleaseLookup = Callable[[str, float], bool]
"""Whether a card left a placed claim after a moment (see ``Ledger.released_after``)."""


def _nothing_pending(server: str) -> tuple[Claim, ...]:
    return ()


def _holds_nothing(uid: str) -> bool:
    return False


def _never_released(card: str, moment: float) -> bool:
    return False


def _merely_old(claim: Claim, pod: PodInfo | None) -> bool:
    """Whether only the claim's age, not a fact about its pod, makes it invalid."""
    return pod is not None and pod.uid == claim.pod.uid and not pod.finished


def _uuid(card: CardId) -> str:
    return split_card_id(card)[1]


def _unchanged(record: LeaseRecord, seen: tuple[PodInfo | None, ...], pods: PodIndex) -> bool:
    """Whether every claim's pod is still the object ``seen`` when it was judged."""
    for claim, pod in zip(record.claims, seen, strict=True):
        if pods.get(claim.pod.uid) is not pod:
            return False
    return True


SETTLED_KEPT = 65_536
"""Servers ``Settled`` remembers; past it the memo starts over (bounded)."""


class Settled:
    """Per server, the stored claims that hold its cards, remembered for the Lease version and
    the pod states they were judged on, until the first of them could lapse.

    A decision judges the servers in best-fit order until one fits, and in a burst the first
    hundreds are held by pods admitted and not yet bound: each decision judged each of them
    again, though their verdicts only change when a Lease or a pod changes, or a booking's
    TTL runs out. The memo is keyed on the Lease record and on each claim's pod object (both
    immutable and replaced on change), so a change to either is a miss, never a stale answer,
    and it holds until the earliest lapse among the fresh bookings it counted. Claims whose
    pod is not in the cache, and servers holding a booking already past its TTL (whose verdict
    depends on how far the cache is trusted), are never remembered.
    """

    __slots__ = ("_found",)

    def __init__(self) -> None:
        self._found: dict[str, _Memo] = {}

    def holding(
        self, record: LeaseRecord, pods: PodIndex, now: float, ttl: float
    ) -> tuple[Claim, ...] | None:
        """The claims of ``record`` that hold their cards at ``now``, if that can be told
        without the cache's trust; ``None`` when it cannot."""
        found = self._found.get(record.server)
        if (
            found is not None
            and found.record is record
            and now < found.until
            and _unchanged(record, found.seen, pods)
        ):
            return found.holding
        memo = _judged(record, pods, now, ttl)
        if memo is None:
            return None
        if len(self._found) >= SETTLED_KEPT:
            self._found.clear()
        self._found[record.server] = memo
        return memo.holding


@dataclass(frozen=True, slots=True)
class _Memo:
    record: LeaseRecord
    seen: tuple[PodInfo | None, ...]
    holding: tuple[Claim, ...]
    until: float
    """When the first fresh booking counted in ``holding`` lapses (``inf``: none)."""


def _judged(record: LeaseRecord, pods: PodIndex, now: float, ttl: float) -> _Memo | None:
    seen = tuple(pods.get(c.pod.uid) for c in record.claims)
    holding: list[Claim] = []
    until = math.inf
    for claim, pod in zip(record.claims, seen, strict=True):
        verdict = lasting(claim, pod)
        if verdict is None:
            lapses = expires_at(claim, pod, ttl) if pod is not None else None
            if lapses is None or now >= lapses:
                return None
            until, verdict = min(until, lapses), Validity.VALID
        if verdict is Validity.VALID:
            holding.append(claim)
    return _Memo(record=record, seen=seen, holding=tuple(holding), until=until)


class Occupancy:
    """Claims of pods other than ``uid`` that still hold cards, per server, at time ``now``."""

    __slots__ = (
        "_cache",
        "_holds",
        "_leases",
        "_now",
        "_observed",
        "_pending",
        "_pods",
        "_priority",
        "_released",
        "_settled",
        "_trusted",
        "_ttl",
        "uid",
    )

    def __init__(
        self,
        leases: LeaseLookup,
        pods: PodIndex,
        *,
        uid: PodUID,
        now: float,
        ttl: float,
        pending: PendingLookup = _nothing_pending,
        released: ReleaseLookup = _never_released,
        observed_at: float = float("inf"),
        trusted: bool = True,
        priority: int = 0,
        holds: HoldsLookup = _holds_nothing,
        settled: Settled | None = None,
    ) -> None:
        self._leases = leases
        self._settled = settled
        self._priority = priority
        self._holds = holds
        self._trusted = trusted
        self._pending = pending
        self._released = released
        self._observed = observed_at
        self._pods = pods
        self._now = now
        self._ttl = ttl
        self.uid = uid
        self._cache: dict[str, tuple[Claim, ...]] = {}

    def validity(self, claim: Claim) -> Validity:
        """The verdict on any claim, from the pod cache at this decision's time.

        On a cache that is not ``trusted`` (its watch has been silent too long) "the pod is
        still unbound and the claim is old" may only mean the binding was missed: that claim
        is ``UNKNOWN`` (it keeps blocking until a fresh read decides), never ``INVALID``.
        """
        uid = claim.pod.uid
        pod = self._pods.get(uid)
        verdict = judge(claim, pod, now=self._now, ttl=self._ttl, gone=self._pods.gone(uid))
        if verdict is Validity.INVALID and not self._trusted and _merely_old(claim, pod):
            return Validity.UNKNOWN
        return verdict

    def blocking(self, server: str) -> tuple[Claim, ...]:
        """Claims of other pods on ``server`` that are valid or not yet known to be invalid."""
        found = self._cache.get(server)
        if found is None:
            found = self._judge(server)
            self._cache[server] = found
        return found

    def problem(self, server: str) -> str | None:
        """Why the server's Lease cannot be trusted (it then counts as fully held)."""
        record = self._leases(server)
        problem = record.problem if record is not None else None
        return f"claims unreadable: {problem}" if problem else None

    def taken(self, server: str) -> frozenset[CardId]:
        """Cards of ``server`` held by other pods."""
        return frozenset(card for claim in self.blocking(server) for card in claim.cards)

    def busy(self, facts: ServerFacts, *, claims_gone: bool = False) -> frozenset[str]:
        """GPU UUIDs of ``facts`` whose busy report still counts (see the module docstring).

        With ``claims_gone``, the busy reports every placed claim explains are discounted too
        ("would this server be free if its holders were gone?").
        """
        if not facts.busy:
            return facts.busy
        record = self._leases(facts.name)
        claims = record.claims if record is not None else ()
        stale = {
            _uuid(card)
            for c in claims
            if placed(c) and (claims_gone or not self.validity(c).blocks)
            for card in c.cards
        }
        stale.update(
            u for u in facts.busy if self._released(card_id(facts.name, u), self._observed)
        )
        return facts.busy - stale if stale else facts.busy

    def without_claims(self) -> ClaimsGone:
        """These holdings as if every claim were gone (lupine's reports of them too)."""
        return ClaimsGone(self)

    def _judge(self, server: str) -> tuple[Claim, ...]:
        record = self._leases(server)
        if record is not None and record.nomination is None and self._settled is not None:
            holding = self._settled.holding(record, self._pods, self._now, self._ttl)
            if holding is not None and not self._pending(server):
                return tuple(c for c in holding if c.pod.uid != self.uid)
        stored = record.claims if record is not None else ()
        held = [c for c in stored if c.pod.uid != self.uid and self.validity(c).blocks]
        seen = {c.pod.uid for c in stored} | {self.uid}
        held.extend(c for c in self._pending(server) if c.pod.uid not in seen)
        promised = self._promised(record)
        if promised is not None and promised.pod.uid not in seen:
            held.append(promised)
        return tuple(held)

    def _promised(self, record: LeaseRecord | None) -> Claim | None:
        """The server's nomination as the nominee's hold, while it still keeps this pod off."""
        nomination = record.nomination if record is not None else None
        if record is None or nomination is None:
            return None
        nominee = nomination.pod.uid
        if not nomination.holds_against(self.uid, self._priority, self._now):
            return None
        pod = self._pods.get(nominee)
        if self._pods.gone(nominee) or (pod is not None and pod.finished) or self._holds(nominee):
            return None
        return nomination.as_claim(record.server)


class ClaimsGone(Unclaimed):
    """``Occupancy`` with its claims removed: which servers only claims keep from a pod (the
    busy reports of claimed cards no longer count either)."""

    __slots__ = ("_held",)

    def __init__(self, held: Occupancy) -> None:
        self._held = held

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return self._held.busy(facts, claims_gone=True)
