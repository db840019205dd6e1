"""Inside one replica many requests are decided at once, every decision deterministic: without
care a burst of pods all choose the same best server and lose the compare-and-swap to each
other one by one. So a booking being written counts as held for every other decision in this
replica until the write ends (``Pending``; kube-scheduler "assumes" pods the same way), and
concurrent decisions spread over different servers; across replicas, compare-and-swap still
decides. A plan being worked out lays its own bookings over those (``Layered``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rgpu_contracts import Claim, PodUID

__all__ = ["Layered", "Pending"]


class Pending:
    """Bookings of this replica whose Lease write is in flight, per server."""

    __slots__ = ("_by_server",)

    def __init__(self) -> None:
        self._by_server: dict[str, dict[PodUID, Claim]] = {}

    def claims(self, server: str) -> tuple[Claim, ...]:
        found = self._by_server.get(server)
        return tuple(found.values()) if found else ()

    def cards_by_namespace(self) -> dict[str, int]:
        """Cards of the bookings in flight, per pod namespace (quotas count them as held)."""
        found: dict[str, int] = {}
        for held in self._by_server.values():
            for claim in held.values():
                namespace = claim.pod.namespace
                found[namespace] = found.get(namespace, 0) + len(claim.cards)
        return found

    def add(self, claim: Claim) -> None:
        """Count ``claim`` as held until ``discard``."""
        self._by_server.setdefault(claim.server, {})[claim.pod.uid] = claim

    def discard(self, claim: Claim) -> None:
        """Stop counting ``claim`` (its write ended, whichever way)."""
        held = self._by_server.get(claim.server, {})
        held.pop(claim.pod.uid, None)
        if not held:
            self._by_server.pop(claim.server, None)

    @contextmanager
    def hold(self, claim: Claim) -> Iterator[None]:
        """Count ``claim`` as held while the block runs."""
        self.add(claim)
        try:
            yield
        finally:
            self.discard(claim)


class Layered(Pending):
    """Bookings of a plan being worked out, over the bookings really in flight: a plan's
    choices spread over servers as a pass's writes will, without counting as in flight."""

    __slots__ = ("_base",)

    def __init__(self, base: Pending) -> None:
        super().__init__()
        self._base = base

    def claims(self, server: str) -> tuple[Claim, ...]:
        return (*self._base.claims(server), *super().claims(server))
