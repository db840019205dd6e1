"""A service that decides on a peer's value (the fleet, the topology, the claims) reads its
own copy, never the peer, and must be able to say how fresh that copy is. A ``Mirror`` is that
copy of one feed: the latest value taken, each in turn (``latest``), and the peer's health as
the calls to it went (``status``).

It exists for the life of the service, before any client does (the allocator's metrics read
it from the start), and is kept current by a ``Follower`` that the lifespan runs over the
peer's client; nothing but that follower writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import anyio

from ._feed import Feed, Revisioned
from ._versioned import Versioned

__all__ = ["FollowStatus", "Mirror"]

T = TypeVar("T", bound=Revisioned)


class FollowStatus:
    """What a follower knows about its peer's health; mutated only by the follower."""

    __slots__ = (
        "answered",
        "asked",
        "failures",
        "last_error",
        "last_success",
        "name",
        "revision",
        "up",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.up = False
        """Whether the last call succeeded."""
        self.last_success: float | None = None
        """When (follower clock) the peer last answered; ``None`` before the first answer."""
        self.revision: int | None = None
        """The revision of the value held."""
        self.last_error = ""
        """Why the last call failed; empty once the peer answers again."""
        self.failures = 0
        """Calls failed in a row."""
        self.answered = anyio.Event()
        """Set at the first successful answer (when ``run`` reports started)."""
        self.asked = anyio.Event()
        """Set when the first call ended, answered or failed: a lifespan that serves either
        way waits for this, so with the peer up it serves with a value from the start."""

    def age(self, now: float) -> float | None:
        """Seconds since the last successful answer, ``None`` before the first."""
        return None if self.last_success is None else max(0.0, now - self.last_success)


class Mirror(Generic[T]):
    """The latest value of ``feed`` this service took, and how the calls for it went.

    ``on_change`` hears of every value taken (before readers of ``latest`` are woken),
    ``on_status`` of every call's end.
    """

    __slots__ = ("_on_change", "_on_status", "feed", "latest", "status")

    def __init__(
        self,
        feed: Feed[T],
        *,
        name: str,
        on_change: Callable[[T], object] | None = None,
        on_status: Callable[[FollowStatus], object] | None = None,
    ) -> None:
        self.feed = feed
        self._on_change = on_change
        self._on_status = on_status
        self.status = FollowStatus(name)
        self.latest: Versioned[T | None] = Versioned(None, revision=0)
        """Every value taken, in turn; its own revision counts them (not the peer's)."""

    @property
    def value(self) -> T | None:
        """The latest value taken; ``None`` before the first."""
        return self.latest.value

    def age(self, now: float) -> float | None:
        """Seconds (on the follower's clock) since the peer last answered; ``None`` before."""
        return self.status.age(now)

    def took(self, value: T) -> None:
        """The follower took ``value`` (a newer revision than the one held)."""
        self.status.revision = value.revision
        if self._on_change is not None:
            self._on_change(value)
        self.latest.publish(value)

    def called(self) -> None:
        """A call to the peer ended; ``status`` says how."""
        self.status.asked.set()
        if self._on_status is not None:
            self._on_status(self.status)
