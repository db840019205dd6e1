"""The fleet, topology and claims are all served by long-poll.

A ``Versioned`` holds the latest value and a revision that ``publish`` bumps. A reader that
already has revision ``since`` calls ``wait_newer(since, timeout)``: it returns at once when
the revision differs, otherwise when the next ``publish`` happens (every waiter is woken by
the same event) or when ``timeout`` passes. "Differs" rather than "is greater" so a client
that carries a revision from before a server restart gets the current value immediately
instead of sleeping out its timeout.
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
        """The current revision; starts at ``revision`` (1) and grows by one per publish."""
        return self._revision

    @property
    def value(self) -> T:
        """The current value."""
        return self._value

    def snapshot(self) -> tuple[int, T]:
        """The current ``(revision, value)``, consistent with each other."""
        return self._revision, self._value

    def publish(self, value: T) -> int:
        """Replace the value, bump the revision, wake every waiter; returns the new revision."""
        self._value = value
        self._revision += 1
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()
        return self._revision

    async def wait_newer(self, since: int, timeout: float) -> tuple[int, T]:
        """Return ``(revision, value)`` once the revision differs from ``since``.

        Returns at once when it already differs; otherwise at the next ``publish`` or after
        ``timeout`` seconds, whichever comes first (then with the unchanged snapshot).
        """
        if self._revision != since:
            return self.snapshot()
        if self._changed is None:
            self._changed = anyio.Event()
        changed = self._changed
        with anyio.move_on_after(timeout):
            await changed.wait()
        return self.snapshot()
