"""One lock per key (a pod uid, a server), created on demand and dropped when nobody holds or
waits for it, so requests for the same pod, or writes to the same Lease, go one at a time
without an ever-growing table of locks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

__all__ = ["KeyedLocks"]


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
