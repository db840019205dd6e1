"""kube-scheduler calls ``/prioritize`` right after ``/filter`` in the same scheduling cycle,
and prioritize needs the server filter just booked for the pod. Asking the allocator again
costs a hop on kube-scheduler's serial path for an answer this replica received a moment ago,
so filter's bookings are kept here for a few seconds.

Only a hint for scoring (kube-scheduler's own scores still weigh in, and a wrong score never
double-books anything): a booking made through another replica is not here and the
allocator is asked; an entry older than ``KEEP_SECONDS`` is not trusted, since the pod's
claim could have lapsed and been re-booked elsewhere since.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

__all__ = ["KEEP_SECONDS", "KEPT", "RecentBookings"]

KEEP_SECONDS: Final = 5.0
"""A prioritize follows its filter within milliseconds; a claim cannot lapse (booking TTL,
30 s by default) and be re-booked within this."""
KEPT: Final = 4096
"""Pods remembered at most; the oldest go first (a burst keeps its newest)."""


class RecentBookings:
    """The server each pod was just booked on by this replica's ``/filter``, by pod uid."""

    __slots__ = ("_clock", "_kept", "_servers")

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, kept: int = KEPT) -> None:
        self._clock = clock
        self._kept = kept
        self._servers: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def remember(self, uid: str, server: str) -> None:
        """``uid`` was booked on ``server`` now."""
        self._servers.pop(uid, None)
        self._servers[uid] = (server, self._clock())
        while len(self._servers) > self._kept:
            self._servers.popitem(last=False)

    def forget(self, uid: str) -> None:
        """``uid`` holds nothing from this replica's point of view (refused, released)."""
        self._servers.pop(uid, None)

    def server_of(self, uid: str) -> str | None:
        """The server ``uid`` was booked on less than ``KEEP_SECONDS`` ago, if by this replica."""
        found = self._servers.get(uid)
        if found is None or self._clock() - found[1] >= KEEP_SECONDS:
            return None
        return found[0]
