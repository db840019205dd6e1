"""What can be said of a bearer token without asking the apiserver, and what asking may cost.

Each distinct bogus token used to cost one TokenReview (3,000 random tokens: 3,000 reviews), a
request the apiserver serves for whoever can reach a guarded route. So:

* A token is refused for free when it cannot be a ServiceAccount token for this service: not a
  JWT, claims unreadable, no ``aud`` naming this service's audience, no ``exp`` or one in the
  past. The claims are read unverified, so they only ever refuse, never accept.
* Verdicts are kept by a hash of the token (never the token), confirmed and refused apart, each
  bounded and least recently used evicted, so a flood of refusals cannot push a caller's
  confirmed verdict out.
* What is left costs a review only within ``ReviewBudget`` (a rate with a burst); a token that
  finds it spent waits a moment for its turn and is otherwise answered 503, retryable.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from rgpu_runtime.pacing import TokenBucket

__all__ = [
    "MAX_CONFIRMED_VERDICTS",
    "MAX_REFUSED_VERDICTS",
    "REVIEWS_PER_SECOND",
    "REVIEW_BURST",
    "REVIEW_WAIT_SECONDS",
    "ReviewBudget",
    "Verdict",
    "VerdictCache",
    "Verdicts",
    "expiry",
    "unreviewable",
]

MAX_CONFIRMED_VERDICTS = 1024
"""Confirmed tokens remembered: a few per calling pod."""
MAX_REFUSED_VERDICTS = 4096
"""Refused tokens remembered; only bounds what a flood of them costs in memory."""
REVIEWS_PER_SECOND = 10.0
"""TokenReviews of tokens not yet judged, per second, after the burst: honest callers present
a new token about once an hour per pod."""
REVIEW_BURST = 50
"""Reviews a quiet service may spend at once (a fleet of callers starting together)."""
REVIEW_WAIT_SECONDS = 1.0
"""How long a token waits for the review budget before the caller gets a 503 (retryable)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What TokenReview (or the free checks) said of one token, and until when it holds."""

    username: str | None
    """The confirmed user, or None when the token was refused."""
    reason: str
    expires: float


class VerdictCache:
    """Verdicts by token hash, each until its own expiry, least recently used evicted."""

    def __init__(self, *, max_entries: int = MAX_CONFIRMED_VERDICTS) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, Verdict] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float) -> Verdict | None:
        """The verdict for ``key`` if it has not expired at ``now``."""
        verdict = self._entries.get(key)
        if verdict is None:
            return None
        if now >= verdict.expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return verdict

    def put(self, key: bytes, verdict: Verdict) -> None:
        self._entries[key] = verdict
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


class Verdicts:
    """Confirmed and refused verdicts, kept apart so refusals never evict confirmations."""

    def __init__(
        self,
        *,
        confirmed: VerdictCache | None = None,
        refused: VerdictCache | None = None,
    ) -> None:
        self.confirmed = VerdictCache() if confirmed is None else confirmed
        self.refused = (
            VerdictCache(max_entries=MAX_REFUSED_VERDICTS) if refused is None else refused
        )

    def __len__(self) -> int:
        return len(self.confirmed) + len(self.refused)

    def get(self, key: bytes, now: float) -> Verdict | None:
        return self.confirmed.get(key, now) or self.refused.get(key, now)

    def put(self, key: bytes, verdict: Verdict) -> None:
        (self.refused if verdict.username is None else self.confirmed).put(key, verdict)


class ReviewBudget:
    """TokenReviews of unjudged tokens: ``rate`` per second after a ``burst``."""

    def __init__(
        self,
        *,
        rate: float = REVIEWS_PER_SECOND,
        burst: int = REVIEW_BURST,
        wait_seconds: float = REVIEW_WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.wait_seconds = wait_seconds
        self._bucket = TokenBucket(rate, burst=burst, clock=clock)

    async def spend(self) -> bool:
        """Take one review; wait up to ``wait_seconds`` for one; False when none came."""
        with anyio.move_on_after(self.wait_seconds):
            # The bucket refills with time, not with an event anyone could set.
            while not self._bucket.take():  # noqa: ASYNC110
                await anyio.sleep(1 / self.rate)
            return True
        return False


def unreviewable(token: str, audience: str, now: float) -> str | None:
    """Why ``token`` cannot be a ServiceAccount token for ``audience`` at ``now``, or None
    (then only TokenReview can tell)."""
    claims = _claims(token)
    if claims is None:
        return "not a ServiceAccount token (a JWT of three base64url parts with JSON claims)"
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if audience not in audiences:
        return f"the token's audiences {audiences!r} do not include {audience!r}"
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return "the token has no expiry (exp)"
    if exp <= now:
        return "the token has expired"
    return None


def expiry(token: str) -> float | None:
    """The token's ``exp`` (epoch seconds), read unverified: it only shortens a cache entry."""
    claims = _claims(token)
    exp = None if claims is None else claims.get("exp")
    return float(exp) if isinstance(exp, int) and not isinstance(exp, bool) else None


def _claims(token: str) -> dict[str, Any] | None:
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        return None
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    return claims if isinstance(claims, dict) else None
