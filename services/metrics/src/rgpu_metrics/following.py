"""The exporter mirrors two peers and must survive either going away.

A ``Follower`` long-polls one source for as long as the service runs: each answer goes to the
board at once, and a failure leaves the last good value in place (the series stay, their
age grows) while the follower backs off, capped, and tries again. After a failure, and at
start, it asks without ``since`` so a recovered peer is noticed within one round trip rather
than after a full long-poll. Its ``SourceStatus`` feeds ``rgpu_source_up`` and
``rgpu_source_age_seconds`` and, through ``answered``, the readiness probe.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NoReturn, TypeVar

import anyio
from anyio.abc import TaskStatus

from rgpu_runtime import Backoff

from .errors import SourceInvalid, SourceUnavailable
from .sources import SourceClient

__all__ = ["FollowPolicy", "Follower", "SourceStatus"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowPolicy:
    """How the exporter follows its sources."""

    wait_seconds: float = 10.0
    """How long a peer may hold a long-poll. It bounds ``rgpu_source_age_seconds`` of a healthy
    but quiet source, so it stays below Prometheus' usual 15 s scrape interval."""
    margin_seconds: float = 5.0
    """Extra seconds a call may take beyond ``wait_seconds`` before it counts as failed: a
    10,000-card fleet is a few MB of JSON, and a GC pause must not mark a peer down."""
    min_interval_seconds: float = 0.1
    """Least time between two calls to one source, so a peer that ignores ``wait`` (an old
    build, or replicas at different revisions) costs at most ten calls a second."""
    backoff_initial_seconds: float = 0.5
    """First retry delay after a failure; a restarting peer is usually back within a second."""
    backoff_cap_seconds: float = 15.0
    """Longest retry delay: a recovered peer is followed again within one scrape interval."""


class SourceStatus:
    """What the exporter knows about one source's health; mutated only by its follower."""

    __slots__ = ("answered", "last_error", "last_success", "name", "revision", "up")

    def __init__(self, name: str) -> None:
        self.name = name
        self.up = False
        self.last_success: float | None = None
        self.revision: int | None = None
        self.last_error = ""
        self.answered = anyio.Event()

    def age(self, now: float) -> float | None:
        """Seconds since the last successful answer, ``None`` before the first."""
        return None if self.last_success is None else max(0.0, now - self.last_success)


class Follower(Generic[T]):
    """Long-poll one source forever, handing each value to ``apply``."""

    def __init__(
        self,
        client: SourceClient[T],
        *,
        policy: FollowPolicy,
        apply: Callable[[T], None],
        revision: Callable[[T], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._policy = policy
        self._apply = apply
        self._revision = revision
        self._clock = clock
        self._backoff = Backoff(
            initial=policy.backoff_initial_seconds, maximum=policy.backoff_cap_seconds
        )
        self._rng = random.Random()
        self._failures = 0
        self.status = SourceStatus(client.source.name)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> NoReturn:
        """Follow the source until cancelled; started at once (readiness waits on ``answered``)."""
        task_status.started()
        while True:
            started = self._clock()
            await self._poll_once()
            pause = started + self._policy.min_interval_seconds - self._clock()
            await anyio.sleep(max(0.0, pause))

    async def _poll_once(self) -> None:
        since = self.status.revision if self.status.up else None
        try:
            value = await self._client.fetch(since, self._policy.wait_seconds)
        except (SourceUnavailable, SourceInvalid) as exc:
            self._failed(exc)
            await anyio.sleep(self._backoff.delay(self._failures - 1, self._rng))
            return
        self._succeeded(value)

    def _succeeded(self, value: T | None) -> None:
        status = self.status
        if value is not None:
            self._apply(value)
            status.revision = self._revision(value)
        if not status.up and status.last_error:
            logger.info("source %s is back", status.name, extra={"source": status.name})
        status.up, status.last_error = True, ""
        status.last_success = self._clock()
        self._failures = 0
        status.answered.set()

    def _failed(self, exc: SourceUnavailable | SourceInvalid) -> None:
        status = self.status
        if status.up or not status.last_error:
            logger.warning(
                "source %s failed, serving its last snapshot: %s",
                status.name,
                exc.message,
                extra={"source": status.name, "code": exc.code},
            )
        status.up, status.last_error = False, exc.message
        self._failures += 1
