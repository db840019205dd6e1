"""An admission that fails on the apiserver (a timeout, a 5xx, a conflict lost twice) is tried
again, but not at once: an overloaded apiserver answered with an immediate retry of every
failed admission is pushed into a storm of writes that all time out (seen at 1,000 servers on
a saturated machine). Each pod backs off on its own, so one stuck pod holds no one else back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from rgpu_runtime.pacing import Backoff

__all__ = ["RETRY", "Retries"]

RETRY: Final = Backoff(initial=0.5, maximum=30.0)
"""Between two admissions of one pod that failed; capped well below the admission TTL."""


class Retries:
    """Pods whose last admission failed, and when each may be tried again."""

    __slots__ = ("_clock", "_policy", "_until")

    def __init__(self, clock: Callable[[], float], policy: Backoff = RETRY) -> None:
        self._clock, self._policy = clock, policy
        self._until: dict[str, tuple[int, float]] = {}

    def failed(self, uids: Iterable[str]) -> None:
        """The admission of ``uids`` failed: each waits longer than after its last failure."""
        now = self._clock()
        for uid in uids:
            failures = self._until.get(uid, (0, 0.0))[0]
            self._until[uid] = (failures + 1, now + self._policy.delay(failures))

    def forget(self, uid: str) -> None:
        """``uid`` was admitted, or is gone."""
        self._until.pop(uid, None)

    def waiting(self) -> set[str]:
        """Pods not to be tried yet."""
        now = self._clock()
        return {uid for uid, (_, until) in self._until.items() if until > now}

    def next_in(self, longest: float) -> float:
        """Seconds until the first waiting pod may be tried again, at most ``longest``."""
        now = self._clock()
        ahead = (until - now for _, until in self._until.values() if until > now)
        return min([longest, *ahead])
