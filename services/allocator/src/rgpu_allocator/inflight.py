"""Inside one replica, many requests are decided at once, and every
decision is deterministic — without care, a burst of pods all choose the same best server
and then lose the compare-and-swap to each other one by one. Two small tools prevent that:

* ``Pending``: a booking being written counts as held for every other decision in this
  replica until the write ends (kube-scheduler "assumes" pods the same way), so concurrent
  decisions spread over different servers; across replicas, compare-and-swap still decides.
* ``KeyedLocks``: one lock per key (a pod uid, a server), created on demand and dropped when
  nobody holds or waits for it, so requests for the same pod, or writes to the same Lease,
  go one at a time without an ever-growing table of locks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import anyio

from rgpu_contracts import Claim, PodUID

__all__ = ["KeyedLocks", "Pending"]


class Pending:
    """Bookings of this replica whose Lease write is in flight, per server."""

    __slots__ = ("_by_server",)

    def __init__(self) -> None:
        self._by_server: dict[str, dict[PodUID, Claim]] = {}

    def claims(self, server: str) -> tuple[Claim, ...]:
        found = self._by_server.get(server)
        return tuple(found.values()) if found else ()

    @contextmanager
    def hold(self, claim: Claim) -> Iterator[None]:
        """Count ``claim`` as held while the block runs."""
        self._by_server.setdefault(claim.server, {})[claim.pod.uid] = claim
        try:
            yield
        finally:
            held = self._by_server.get(claim.server, {})
            held.pop(claim.pod.uid, None)
            if not held:
                self._by_server.pop(claim.server, None)


class KeyedLocks:
    """A lock per key, alive only while someone holds or waits for it."""

    __slots__ = ("_locks",)

    def __init__(self) -> None:
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (anyio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
