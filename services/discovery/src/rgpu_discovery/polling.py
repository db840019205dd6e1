"""The fleet and the topology are long-polled — a client that holds
revision ``R`` asks with ``?since=R&wait=S`` and gets an answer as soon as something newer
is published, or the current value after ``S`` seconds — and both endpoints must read and
check those parameters the same way, naming the bad one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from rgpu_runtime import Versioned

from .errors import BadPollParameter, NotListedYet
from .published import Published

__all__ = ["DEFAULT_WAIT_SECONDS", "MAX_WAIT_SECONDS", "Poll", "answer"]

MAX_WAIT_SECONDS: Final = 60.0
"""Longest a request is held: below the usual 60-120 s idle timeouts of proxies in between."""
DEFAULT_WAIT_SECONDS: Final = 30.0
"""Hold time when ``since`` is given without ``wait``."""

V = TypeVar("V")


@dataclass(frozen=True, slots=True, kw_only=True)
class Poll:
    """A request's long-poll: wait for a revision other than ``since``, up to ``wait`` s."""

    since: int | None = None
    wait: float = 0.0

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Poll:
        """Read ``since`` and ``wait``; raises ``BadPollParameter`` naming the bad one."""
        since = _since(query.get("since"))
        wait = _wait(query.get("wait"))
        if since is None and wait is not None:
            raise BadPollParameter("wait", "needs 'since' (the revision you hold) to wait for")
        if since is None:
            return cls()
        return cls(since=since, wait=DEFAULT_WAIT_SECONDS if wait is None else wait)


async def answer(published: Versioned[Published[V]], poll: Poll, what: str) -> Published[V]:
    """The snapshot to answer ``poll`` with; raises ``NotListedYet`` before the first list."""
    if poll.since is None:
        snapshot = published.value
    else:
        _, snapshot = await published.wait_newer(poll.since, poll.wait)
    if not snapshot.listed:
        raise NotListedYet(what)
    return snapshot


def _since(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise BadPollParameter("since", f"{raw[:40]!r} is not a revision (a whole number >= 0)")
    return int(raw)


def _wait(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        wait = float(raw)
    except ValueError:
        wait = math.nan
    if not 0 <= wait <= MAX_WAIT_SECONDS:
        raise BadPollParameter(
            "wait", f"{raw[:40]!r} is not a number of seconds from 0 to {MAX_WAIT_SECONDS:g}"
        )
    return wait
