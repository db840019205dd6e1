"""The fleet, topology and claims are all served by long-poll.

A ``Versioned`` holds the latest value and a revision that ``publish`` moves forward (by one,
or to a revision the publisher derived from the apiserver, so replicas agree on it). A reader
that already has revision ``since`` calls ``wait_newer(since, timeout)``:

* ``since`` below the revision: it returns at once (the reader is behind);
* ``since`` equal to it: at the next ``publish`` (every waiter is woken by the same event);
* ``since`` above it (the reader came from a replica further along): once the revision
  passes ``since``, never with the lower value while waiting, so a reader that switches
  replicas is not handed an older state as news;

and in every case after ``timeout`` at the latest, then with the current snapshot (which the
caller must compare with ``since``).
"""

from __future__ import annotations

from typing import Generic, TypeVar

import anyio

__all__ = ["Versioned"]

T = TypeVar("T")


class Versioned(Generic[T]):
    """The latest value of something, its revision, and a way to wait for the next one."""

    __slots__ = ("_changed", "_revision", "_value")

    def __init__(self, value: T, *, revision: int = 1) -> None:
        self._value = value
        self._revision = revision
        # Created on first wait: anyio needs a running event loop to make an Event, and a
        # value nobody waits on should cost nothing per publish.
        self._changed: anyio.Event | None = None

    @property
    def revision(self) -> int:
        """The current revision; starts at ``revision`` (1) and grows with every publish."""
        return self._revision

    @property
    def value(self) -> T:
        """The current value."""
        return self._value

    def snapshot(self) -> tuple[int, T]:
        """The current ``(revision, value)``, consistent with each other."""
        return self._revision, self._value

    def publish(self, value: T, *, revision: int | None = None) -> int:
        """Replace the value, move the revision (one up, or to ``revision``), wake every
        waiter; returns the new revision. Raises ``ValueError`` for a ``revision`` that does
        not move forward: readers compare revisions, and one reused would hide a change."""
        if revision is not None and revision <= self._revision:
            raise ValueError(f"revision {revision} does not follow {self._revision}")
        self._value = value
        self._revision = self._revision + 1 if revision is None else revision
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()
        return self._revision

    async def wait_newer(self, since: int, timeout: float) -> tuple[int, T]:
        """Return ``(revision, value)`` once the revision is past ``since`` (at once when
        ``since`` is already below it), or the current snapshot after ``timeout`` seconds."""
        if self._revision > since or timeout <= 0:
            return self.snapshot()
        with anyio.move_on_after(timeout):
            while self._revision <= since:
                await self._next_publish()
        return self.snapshot()

    async def _next_publish(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()
