"""Every retry loop (watches, probes, peer calls) waits the same way.

Delays grow exponentially from ``initial`` by ``multiplier`` up to ``maximum``, and each is
shortened by a random fraction up to ``jitter`` so replicas that failed together do not
retry together.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """A capped, jittered exponential backoff policy; ``delay(attempt)`` is the wait."""

    initial: float = 0.1
    """Seconds before the first retry; short, because most failures here are blips."""
    maximum: float = 10.0
    """Upper bound in seconds; kube-scheduler's own backoff caps at 10 s too."""
    multiplier: float = 2.0
    """Growth per attempt; doubling is the usual compromise between speed and load."""
    jitter: float = 0.5
    """Largest fraction (0..1) removed at random from each delay, to spread retries."""

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"Backoff needs 0 < initial <= maximum, got {self}")
        if self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"Backoff needs multiplier >= 1 and 0 <= jitter <= 1, got {self}")

    def ceiling(self, attempt: int) -> float:
        """The delay before jitter for ``attempt`` (0-based): ``initial * multiplier**attempt``,
        capped at ``maximum``."""
        if attempt <= 0:
            return self.initial
        if self.multiplier == 1:
            return self.initial
        # Compare exponents instead of computing a power that could overflow a float.
        if attempt >= math.log(self.maximum / self.initial, self.multiplier):
            return self.maximum
        return min(self.maximum, self.initial * self.multiplier**attempt)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based), jitter applied."""
        draw = (rng or random).random()
        return self.ceiling(attempt) * (1 - self.jitter * draw)
