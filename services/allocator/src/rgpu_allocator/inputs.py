"""Decisions read the fleet and the client nodes' topology from
discovery; this keeps the last of each (discovery may go away: the last fleet stays in use and
its age is exposed), follows both by long-poll, and says when new capacity appeared so
refused pods can be woken.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts import Fleet, Topology
from rgpu_placement import FleetView, ServerFacts
from rgpu_runtime import Backoff

from .discovery_client import DiscoveryClient
from .errors import DiscoveryUnavailable

__all__ = ["Inputs", "capacity_grew", "follow_fleet", "follow_topology"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

BACKOFF = Backoff(initial=0.2, maximum=5.0)
"""Retry quickly after a blip, but at most every 5 s while discovery is away."""

QUICK_POLL_SECONDS = 1.0
"""A long-poll that returns nothing new sooner than this is spaced out to this, so a peer
that answers at once (restarting, misbehaving) is not polled in a tight loop."""


def _usable(f: ServerFacts) -> bool:
    return f.problem is None and bool(f.healthy)


def _grew(old: ServerFacts | None, new: ServerFacts) -> bool:
    if not _usable(new):
        return False
    if old is None or not _usable(old):
        return True
    return len(new.healthy) > len(old.healthy) or bool(old.busy - new.busy)


def capacity_grew(old: FleetView | None, new: FleetView) -> bool:
    """Whether a server appeared, became usable, gained healthy cards or lost busy ones."""
    if old is None:
        return False
    return any(_grew(old.facts.get(name), f) for name, f in new.facts.items())


class Inputs:
    """The latest fleet (indexed) and topology, and how old the fleet is."""

    __slots__ = ("_clock", "_keys", "_live", "_received", "_topology", "discovery_error", "view")

    def __init__(
        self, topology_keys: Sequence[str], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._keys = tuple(topology_keys)
        self._clock = clock
        self._received: float | None = None
        self._live = False
        self._topology: Topology | None = None
        self.view: FleetView | None = None
        self.discovery_error: str | None = None
        """Why the last call to discovery failed; ``None`` once it answers again."""

    def set_fleet(self, fleet: Fleet) -> bool:
        """Use ``fleet`` from now on; returns whether capacity grew."""
        old = self.view
        self.view = FleetView.build(fleet, self._topology, self._keys)
        self._received = self._clock()
        return capacity_grew(old, self.view)

    def set_topology(self, topology: Topology) -> None:
        self._topology = topology
        if self.view is not None:
            self.view = self.view.with_topology(topology)

    def fleet_age(self) -> float | None:
        """Seconds the fleet may be out of date: 0 while discovery holds our long-poll (it
        answers the moment anything changes), else the time since it last answered;
        ``None`` before the first fleet."""
        if self._received is None:
            return None
        return 0.0 if self._live else self._clock() - self._received

    def fleet_polled(self, answered: bool) -> None:
        """Discovery answered a fleet poll (``True``) or failed one (``False``)."""
        if answered and self._received is not None:
            self._received = self._clock()
        self._live = answered


async def _follow(
    what: str,
    fetch: Callable[[int | None], Awaitable[T]],
    revision: Callable[[T], int],
    apply: Callable[[T], None],
    inputs: Inputs,
    polled: Callable[[bool], None],
) -> None:
    since: int | None = None
    failures = 0
    while True:
        started = time.monotonic()
        try:
            value = await fetch(since)
        except DiscoveryUnavailable as exc:
            polled(False)
            if failures == 0:
                logger.warning("discovery %s unavailable, keeping the last one: %s", what, exc)
            inputs.discovery_error = exc.message
            await anyio.sleep(BACKOFF.delay(failures))
            failures += 1
            continue
        failures = 0
        inputs.discovery_error = None
        polled(True)
        if revision(value) != since:
            apply(value)
        elif (spent := time.monotonic() - started) < QUICK_POLL_SECONDS:
            await anyio.sleep(QUICK_POLL_SECONDS - spent)
        since = revision(value)


async def follow_fleet(
    client: DiscoveryClient,
    inputs: Inputs,
    on_capacity: Callable[[], None],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Long-poll the fleet forever; calls ``on_capacity`` when capacity grew."""

    def apply(fleet: Fleet) -> None:
        if inputs.set_fleet(fleet):
            on_capacity()

    task_status.started()
    await _follow("fleet", client.fleet, lambda f: f.revision, apply, inputs, inputs.fleet_polled)


async def follow_topology(
    client: DiscoveryClient,
    inputs: Inputs,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Long-poll client nodes' topology forever."""
    task_status.started()
    await _follow(
        "topology", client.topology, lambda t: t.revision, inputs.set_topology, inputs, _ignore
    )


def _ignore(answered: bool) -> None:
    """The topology's freshness is not reported (the fleet's is)."""
