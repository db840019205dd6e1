"""Why this module exists: while choosing a server for one pod, "which cards are held by
someone else?" is asked of many servers; this answers it from the ledger and the pod cache,
judging each claim's validity once per decision.
"""

from __future__ import annotations

from rgpu_contracts import CardId, Claim, PodUID

from .ledger import Ledger
from .pods import PodIndex
from .validity import judge

__all__ = ["Occupancy"]


class Occupancy:
    """Claims of pods other than ``uid`` that still hold cards, per server, at time ``now``."""

    __slots__ = ("_cache", "_ledger", "_now", "_pods", "_ttl", "uid")

    def __init__(
        self, ledger: Ledger, pods: PodIndex, *, uid: PodUID, now: float, ttl: float
    ) -> None:
        self._ledger = ledger
        self._pods = pods
        self._now = now
        self._ttl = ttl
        self.uid = uid
        self._cache: dict[str, tuple[Claim, ...]] = {}

    def blocking(self, server: str) -> tuple[Claim, ...]:
        """Claims of other pods on ``server`` that are valid or not yet known to be invalid."""
        found = self._cache.get(server)
        if found is None:
            found = self._judge(server)
            self._cache[server] = found
        return found

    def problem(self, server: str) -> str | None:
        """Why the server's Lease cannot be trusted (it then counts as fully held)."""
        record = self._ledger.lease(server)
        return record.problem if record is not None else None

    def taken(self, server: str) -> frozenset[CardId]:
        """Cards of ``server`` held by other pods."""
        return frozenset(card for claim in self.blocking(server) for card in claim.cards)

    def _judge(self, server: str) -> tuple[Claim, ...]:
        record = self._ledger.lease(server)
        if record is None:
            return ()
        return tuple(
            c
            for c in record.claims
            if c.pod.uid != self.uid
            and judge(c, self._pods.get(c.pod.uid), now=self._now, ttl=self._ttl).blocks
        )
