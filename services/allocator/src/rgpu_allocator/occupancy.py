"""While choosing a server for one pod, "which cards are held by
someone else?" is asked of many servers; this answers it from the Leases and the pod cache,
judging each claim's validity once per decision.

It also says which of lupine's busy reports still count. A card our own placed pod used is
reported busy until discovery's next probe after that pod is gone; if the pod's claim is
invalid (finished, deleted) or the card was released after the fleet was observed, that
report is stale and ignored — otherwise a freed server would stay refused for a probe
interval. Busy cards no claim explains (clients placed outside rgpu) always count.
"""

from __future__ import annotations

from collections.abc import Callable

from rgpu_contracts import CardId, Claim, PodUID, card_id, split_card_id
from rgpu_placement import ServerFacts, Validity, judge

from .leases import LeaseRecord
from .ledger import placed
from .pods import PodIndex

__all__ = ["ClaimsGone", "LeaseLookup", "Occupancy", "PendingLookup", "ReleaseLookup"]

LeaseLookup = Callable[[str], LeaseRecord | None]
"""Where a server's Lease is read from: the ledger, or a fresher copy during a write."""

PendingLookup = Callable[[str], tuple[Claim, ...]]
"""This replica's bookings still being written, per server (see ``inflight.Pending``)."""


ReleaseLookup = Callable[[str, float], bool]
"""Whether a card left a placed claim after a moment (see ``Ledger.released_after``)."""


def _nothing_pending(server: str) -> tuple[Claim, ...]:
    return ()


def _never_released(card: str, moment: float) -> bool:
    return False


def _uuid(card: CardId) -> str:
    return split_card_id(card)[1]


class Occupancy:
    """Claims of pods other than ``uid`` that still hold cards, per server, at time ``now``."""

    __slots__ = (
        "_cache",
        "_leases",
        "_now",
        "_observed",
        "_pending",
        "_pods",
        "_released",
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
    ) -> None:
        self._leases = leases
        self._pending = pending
        self._released = released
        self._observed = observed_at
        self._pods = pods
        self._now = now
        self._ttl = ttl
        self.uid = uid
        self._cache: dict[str, tuple[Claim, ...]] = {}

    def validity(self, claim: Claim) -> Validity:
        """The verdict on any claim, from the pod cache at this decision's time."""
        uid = claim.pod.uid
        pod = self._pods.get(uid)
        return judge(claim, pod, now=self._now, ttl=self._ttl, gone=self._pods.gone(uid))

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
        return record.problem if record is not None else None

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
        stored = record.claims if record is not None else ()
        held = [c for c in stored if c.pod.uid != self.uid and self.validity(c).blocks]
        seen = {c.pod.uid for c in stored} | {self.uid}
        held.extend(c for c in self._pending(server) if c.pod.uid not in seen)
        return tuple(held)


class ClaimsGone:
    """``Occupancy`` with its claims removed: which servers only claims keep from a pod."""

    __slots__ = ("_held",)

    def __init__(self, held: Occupancy) -> None:
        self._held = held

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return ()

    def problem(self, server: str) -> str | None:
        return None

    def taken(self, server: str) -> frozenset[CardId]:
        return frozenset()

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return self._held.busy(facts, claims_gone=True)

    def without_claims(self) -> ClaimsGone:
        return self
