"""Every long-polled endpoint (discovery's fleet and topology, the allocator's claims) must
read ``?since=R&wait=S`` the same way and hold a request the same way.

A client that holds revision ``R`` asks with ``since=R``: the answer comes as soon as the
revision differs from ``R``, or after ``wait`` seconds with the unchanged value (the wire
protocol never answers ``304``; followers accept one all the same). Without ``since`` the
answer comes at once, and ``wait`` alone is refused: with no revision held there is nothing
to wait for. A parameter that cannot be used is a ``400`` naming it and the fix, never a
``500`` (a ``since`` of thousands of digits would otherwise trip Python's int-parsing limit).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from ._versioned import Versioned
from .errors import BadRequest

__all__ = ["DEFAULT_WAIT_SECONDS", "MAX_SINCE_DIGITS", "MAX_WAIT_SECONDS", "Poll"]

MAX_WAIT_SECONDS: Final = 60.0
"""Longest a request is held: below the usual 60-120 s idle timeouts of proxies in between."""
DEFAULT_WAIT_SECONDS: Final = 30.0
"""Hold time when ``since`` is given without ``wait``."""
MAX_SINCE_DIGITS: Final = 19
"""Revisions are counters or epoch milliseconds (13 digits); 19 digits hold any int64."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Poll:
    """A request's long-poll: wait for a revision other than ``since``, up to ``wait`` s."""

    since: int | None = None
    wait: float = 0.0

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Poll:
        """Read ``since`` and ``wait``; raises ``BadRequest`` naming the unusable one."""
        since = _since(query.get("since"))
        wait = _wait(query.get("wait"))
        if since is None and wait is not None:
            raise _bad("wait", query["wait"], "needs since=<the revision you hold> to wait for")
        if since is None:
            return cls()
        return cls(since=since, wait=DEFAULT_WAIT_SECONDS if wait is None else wait)

    async def answer(self, versioned: Versioned[T]) -> tuple[int, T]:
        """``versioned``'s ``(revision, value)``: at once without ``since``, otherwise once
        the revision differs from ``since`` or ``wait`` seconds passed (then unchanged)."""
        if self.since is None:
            return versioned.snapshot()
        return await versioned.wait_newer(self.since, self.wait)


def _since(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= MAX_SINCE_DIGITS):
        raise _bad(
            "since",
            raw,
            f"is not a revision (a whole number >= 0, at most {MAX_SINCE_DIGITS} "
            "digits); send the revision of the last answer, or no since for the current value",
        )
    return int(raw)


def _wait(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        wait = float(raw)
    except ValueError:
        wait = math.nan
    if not 0 <= wait <= MAX_WAIT_SECONDS:
        raise _bad("wait", raw, f"is not a number of seconds from 0 to {MAX_WAIT_SECONDS:g}")
    return wait


def _bad(name: str, raw: str, problem: str) -> BadRequest:
    return BadRequest(
        f"query parameter {name!r}: {name}={raw[:40]!r} {problem}", code="bad_parameter"
    )
