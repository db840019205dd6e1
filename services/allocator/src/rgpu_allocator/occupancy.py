"""While choosing a server for one pod, "which cards are held by someone else?" is asked of many
servers; ``Occupancy`` answers it from the Leases and the pod cache, judging each claim's
validity (``rgpu_placement.judge``) once per decision. It is one value per decision: it reads
the caches' tables (plain read-only mappings) and never calls back into the caches, so the
booking's compare-and-swap re-fits on the same value with one Lease replaced (``with_lease``).

It also says which of lupine's busy reports still count. A card our own placed pod used is
reported busy until discovery's next probe after that pod is gone; if the pod's claim is
invalid (finished, deleted) or the card was released after the fleet was observed, that
report is stale and ignored — otherwise a freed server would stay refused for a probe
interval. Busy cards no claim explains (clients placed outside rgpu) always count.

A server being freed for an urgent pod (a live ``Nomination`` on its Lease) counts as held by
that pod for every pod of lower or equal priority, so nobody else books what the victims
leave behind; the nomination stops counting once the nominee holds a claim, is gone or
finished, or the nomination expires (docs/design.md §11).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Container, Mapping
from dataclasses import dataclass, field

from rgpu_contracts import CardId, Claim, PodUID, ServerName, card_id, split_card_id
from rgpu_placement import ServerFacts, Unclaimed, Validity, judge

from .claims import LeaseRecord, placed
from .pods import PodInfo
from .settled import Settled

__all__ = ["ClaimsGone", "Occupancy"]


def _merely_old(claim: Claim, pod: PodInfo | None) -> bool:
    """Whether only the claim's age, not a fact about its pod, makes it invalid."""
    return pod is not None and pod.uid == claim.pod.uid and not pod.finished


def _uuid(card: CardId) -> str:
    return split_card_id(card)[1]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Occupancy:
    """Claims of pods other than ``uid`` that still hold cards, per server, at time ``now``
    (compared by identity: its tables are live views, so two values are never "equal")."""

    uid: PodUID
    now: float
    ttl: float
    leases: Mapping[str, LeaseRecord]
    """Every Lease as last seen, by server (``Ledger.by_server``)."""
    pods: Mapping[str, PodInfo]
    """Every pod as last seen, by uid (``PodIndex.by_uid``)."""
    gone: Container[str] = frozenset()
    """Uids known to be deleted (``PodIndex.buried``)."""
    pending: Mapping[str, Mapping[PodUID, Claim]] = field(default_factory=dict)
    """Bookings still being written, per server (``Pending.by_server``): they count as held."""
    planned: Mapping[str, Mapping[PodUID, Claim]] = field(default_factory=dict)
    """Bookings an admission pass has planned so far, per server: they count as held too."""
    holders: Mapping[str, Collection[ServerName]] = field(default_factory=dict)
    """The servers each pod holds claims on (``Ledger.holders``)."""
    releases: Mapping[str, float] = field(default_factory=dict)
    """When each card last left a placed claim (``Ledger.releases``)."""
    observed_at: float = math.inf
    """When the fleet decided on was observed: a card released after it is reported busy
    only because discovery has not probed since."""
    trusted: bool = True
    """Whether the pod cache heard from the apiserver recently enough to drop claims on."""
    priority: int = 0
    """The deciding pod's priority: a nomination holds against pods up to it."""
    settled: Settled | None = None
    """Time-independent verdicts per server, shared by the replica's decisions."""
    replaced: tuple[str, LeaseRecord | None] | None = None
    """One server's Lease as just read (a compare-and-swap re-fits on it), over ``leases``."""
    _found: dict[str, tuple[Claim, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def with_lease(self, server: str, record: LeaseRecord | None) -> Occupancy:
        """The same decision with ``server``'s Lease as just read (``None``: it is gone)."""
        return dataclasses.replace(self, replaced=(server, record))

    def validity(self, claim: Claim) -> Validity:
        """The verdict on any claim, from the pod cache at this decision's time.

        On a cache that is not ``trusted`` (its watch has been silent too long) "the pod is
        still unbound and the claim is old" may only mean the binding was missed: that claim
        is ``UNKNOWN`` (it keeps blocking until a fresh read decides), never ``INVALID``.
        """
        uid = claim.pod.uid
        pod = self.pods.get(uid)
        verdict = judge(claim, pod, now=self.now, ttl=self.ttl, gone=uid in self.gone)
        if verdict is Validity.INVALID and not self.trusted and _merely_old(claim, pod):
            return Validity.UNKNOWN
        return verdict

    def blocking(self, server: str) -> tuple[Claim, ...]:
        """Claims of other pods on ``server`` that are valid or not yet known to be invalid."""
        found = self._found.get(server)
        if found is None:
            found = self._found[server] = self._held(server, in_flight=True)
        return found

    def problem(self, server: str) -> str | None:
        """Why the server's Lease cannot be trusted (it then counts as fully held)."""
        record = self._lease(server)
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
        record = self._lease(facts.name)
        claims = record.claims if record is not None else ()
        stale = {
            _uuid(card)
            for c in claims
            if placed(c) and (claims_gone or not self.validity(c).blocks)
            for card in c.cards
        }
        releases, observed = self.releases, self.observed_at
        stale.update(
            u for u in facts.busy if releases.get(card_id(facts.name, u), -math.inf) > observed
        )
        return facts.busy - stale if stale else facts.busy

    def without_claims(self) -> ClaimsGone:
        """These holdings as if every claim were gone (lupine's reports of them too)."""
        return ClaimsGone(self)

    def mine(self) -> tuple[Claim, ...]:
        """The deciding pod's own claims that still hold their cards, by server name."""
        uid = self.uid
        records = (self._lease(s) for s in sorted(self.holders.get(uid, ())))
        found = (r.claim_of(uid) for r in records if r is not None)
        return tuple(c for c in found if c is not None and self.validity(c).blocks)

    def written(self, server: str) -> tuple[Claim, ...]:
        """Like ``blocking``, counting only the claims as written (no booking in flight)."""
        return self._held(server, in_flight=False)

    def _lease(self, server: str) -> LeaseRecord | None:
        replaced = self.replaced
        if replaced is not None and replaced[0] == server:
            return replaced[1]
        return self.leases.get(server)

    def _held(self, server: str, *, in_flight: bool) -> tuple[Claim, ...]:
        record = self._lease(server)
        pending = self._in_flight(server) if in_flight else ()
        settled = self.settled
        if record is not None and record.nomination is None and settled is not None:
            holding = settled.holding(record, self.pods, self.now, self.ttl)
            if holding is not None and not pending:
                return tuple(c for c in holding if c.pod.uid != self.uid)
        stored = record.claims if record is not None else ()
        held = [c for c in stored if c.pod.uid != self.uid and self.validity(c).blocks]
        seen = {c.pod.uid for c in stored} | {self.uid}
        held.extend(c for c in pending if c.pod.uid not in seen)
        promised = self._promised(record)
        if promised is not None and promised.pod.uid not in seen:
            held.append(promised)
        return tuple(held)

    def _in_flight(self, server: str) -> tuple[Claim, ...]:
        writing, planned = self.pending.get(server), self.planned.get(server)
        if not planned:
            return tuple(writing.values()) if writing else ()
        return (*(writing.values() if writing else ()), *planned.values())

    def _promised(self, record: LeaseRecord | None) -> Claim | None:
        """The server's nomination as the nominee's hold, while it still keeps this pod off."""
        nomination = record.nomination if record is not None else None
        if record is None or nomination is None:
            return None
        nominee = nomination.pod.uid
        if not nomination.holds_against(self.uid, self.priority, self.now):
            return None
        pod = self.pods.get(nominee)
        if nominee in self.gone or (pod is not None and pod.finished) or self.holders.get(nominee):
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
