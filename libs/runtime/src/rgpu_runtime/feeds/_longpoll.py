"""Every long-polled endpoint (discovery's fleet and topology, the allocator's claims) must
read ``?since=R&wait=S`` the same way and hold a request the same way.

A client that holds revision ``R`` asks with ``since=R``: the answer comes as soon as the
revision is past ``R`` (at once when it already is), or after ``wait`` seconds with the
unchanged value (the wire protocol never answers ``304``; followers accept one all the same).
A ``since`` above the publisher's own revision (the client came from a replica further along)
is held until the publisher passes it, never answered early with an older state. Without
``since`` the answer comes at once, and ``wait`` alone is refused: with no revision held
there is nothing to wait for.

``delta=1`` (``true``; ``0``/``false`` is the default) opts in to answers that carry only
what changed since ``R`` (``rgpu_contracts.FleetUpdate``, ``ClaimsUpdate``); clients that
never send it get exactly the bodies they always got.

A parameter that cannot be used is a ``400`` naming it and the fix, never a ``500`` (a
``since`` of thousands of digits would otherwise trip Python's int-parsing limit).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from rgpu_runtime.errors import BadRequest

from ._versioned import Versioned

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
    """A request's long-poll: wait for a revision past ``since``, up to ``wait`` s."""

    since: int | None = None
    wait: float = 0.0
    delta: bool = False
    """Whether the client reads update answers (full, delta or behind)."""

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Poll:
        """Read ``since``, ``wait`` and ``delta``; raises ``BadRequest`` naming the unusable one."""
        since = _since(query.get("since"))
        wait = _wait(query.get("wait"))
        delta = _delta(query.get("delta"))
        if since is None and wait is not None:
            raise _bad("wait", query["wait"], "needs since=<the revision you hold> to wait for")
        if since is None:
            return cls(delta=delta)
        return cls(since=since, wait=DEFAULT_WAIT_SECONDS if wait is None else wait, delta=delta)

    async def answer(self, versioned: Versioned[T]) -> tuple[int, T]:
        """``versioned``'s ``(revision, value)``: at once without ``since``, otherwise once
        the revision is past ``since`` or ``wait`` seconds passed (then as it is)."""
        if self.since is None:
            return versioned.snapshot()
        return await versioned.wait_newer(self.since, self.wait)

    def behind(self, revision: int) -> bool:
        """Whether ``revision`` (the one answered) is below the client's ``since``."""
        return self.since is not None and revision < self.since


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


def _delta(raw: str | None) -> bool:
    if raw is None or raw.lower() in ("0", "false"):
        return False
    if raw.lower() in ("1", "true"):
        return True
    raise _bad("delta", raw, "is not a switch; send delta=1 for updates, or leave it out")


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
