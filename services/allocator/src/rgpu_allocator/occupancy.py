"""Why this module exists: while choosing a server for one pod, "which cards are held by
someone else?" is asked of many servers; this answers it from the Leases and the pod cache,
judging each claim's validity once per decision.
"""

from __future__ import annotations

from collections.abc import Callable

from rgpu_contracts import CardId, Claim, PodUID

from .leases import LeaseRecord
from .pods import PodIndex
from .validity import Validity, judge

__all__ = ["LeaseLookup", "Occupancy", "PendingLookup"]

LeaseLookup = Callable[[str], LeaseRecord | None]
"""Where a server's Lease is read from: the ledger, or a fresher copy during a write."""

PendingLookup = Callable[[str], tuple[Claim, ...]]
"""This replica's bookings still being written, per server (see ``inflight.Pending``)."""


def _nothing_pending(server: str) -> tuple[Claim, ...]:
    return ()


class Occupancy:
    """Claims of pods other than ``uid`` that still hold cards, per server, at time ``now``."""

    __slots__ = ("_cache", "_leases", "_now", "_pending", "_pods", "_ttl", "uid")

    def __init__(
        self,
        leases: LeaseLookup,
        pods: PodIndex,
        *,
        uid: PodUID,
        now: float,
        ttl: float,
        pending: PendingLookup = _nothing_pending,
    ) -> None:
        self._leases = leases
        self._pending = pending
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

    def _judge(self, server: str) -> tuple[Claim, ...]:
        record = self._leases(server)
        stored = record.claims if record is not None else ()
        held = [c for c in stored if c.pod.uid != self.uid and self.validity(c).blocks]
        seen = {c.pod.uid for c in stored} | {self.uid}
        held.extend(c for c in self._pending(server) if c.pod.uid not in seen)
        return tuple(held)
