"""Every rgpu budget (fresh pod reads, Event writes) is a rate with a burst, and the rule
for refilling it should be written, and tested, once.

``TokenBucket`` refills ``rate`` tokens per second up to ``burst``; ``take`` spends one if
there is one and never waits, because the callers are request paths that must not stall.
The clock is injectable so tests step time instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up (default: one second's worth).

    The bucket starts full, so a quiet service can spend a burst at once.
    """

    __slots__ = ("_at", "_burst", "_clock", "_rate", "_tokens")

    def __init__(
        self,
        rate: float,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        burst = rate if burst is None else burst
        if rate <= 0 or burst < 1:
            raise ValueError(f"TokenBucket needs rate > 0 and burst >= 1, got {rate=} {burst=}")
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    @property
    def tokens(self) -> float:
        """Tokens available now (fractional while refilling)."""
        self._refill()
        return self._tokens

    def take(self) -> bool:
        """Spend one token if there is one; ``False`` (nothing spent) when the bucket is dry."""
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _refill(self) -> None:
        now = self._clock()
        # A clock that steps back (never monotonic's, but an injected one may) adds nothing.
        elapsed = max(0.0, now - self._at)
        self._tokens = min(self._burst, self._tokens + elapsed * self._rate)
        self._at = now
