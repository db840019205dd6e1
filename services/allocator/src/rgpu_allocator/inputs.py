"""Decisions read the fleet and the client nodes' topology from
discovery; this keeps the last of each (discovery may go away: the last fleet stays in use and
its age is exposed), follows both by long-poll (``rgpu_runtime.Follower``), and says when
new capacity appeared so refused pods can be woken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final

import httpx

from rgpu_contracts import Fleet, FleetUpdate, Topology
from rgpu_placement import FleetView, ServerFacts
from rgpu_runtime import Follower, FollowPolicy, FollowStatus

__all__ = ["Inputs", "capacity_grew", "follow_fleet", "follow_topology"]

POLICY: Final = FollowPolicy(wait_seconds=30.0, margin_seconds=5.0)
"""Discovery may hold a poll 30 s (well under proxies' 60 s idle timeouts); 5 s more and the
call counts as hung. Pauses and backoff are ``rgpu_runtime.Follower``'s."""


def _usable(f: ServerFacts) -> bool:
    return f.problem is None and bool(f.healthy)


def _grew(old: ServerFacts | None, new: ServerFacts) -> bool:
    if not _usable(new):
        return False
    if old is None or not _usable(old):
        return True
    # An uncordoned card, or a CUDA version learned, can take a pod that waits for it.
    return (
        len(new.healthy) > len(old.healthy)
        or bool(old.busy - new.busy)
        or bool(old.cordoned - new.cordoned)
        or new.cuda_major != old.cuda_major
    )


def capacity_grew(old: FleetView | None, new: FleetView) -> bool:
    """Whether a server appeared, became usable (uncordoned among others), gained healthy
    cards, lost busy or cordoned ones, or changed CUDA version."""
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
        self.view = (
            FleetView.build(fleet, self._topology, self._keys)
            if old is None
            else old.with_fleet(fleet)
        )
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

    def discovery_followed(self, status: FollowStatus) -> None:
        """A call to discovery ended; remember why it failed, or that it did not."""
        self.discovery_error = status.last_error or None

    def fleet_polled(self, answered: bool) -> None:
        """Discovery answered a fleet poll (``True``) or failed one (``False``)."""
        if answered and self._received is not None:
            self._received = self._clock()
        self._live = answered


def follow_fleet(
    http: httpx.AsyncClient,
    inputs: Inputs,
    on_capacity: Callable[[], None],
    *,
    policy: FollowPolicy = POLICY,
) -> Follower[Fleet]:
    """A follower of discovery's fleet into ``inputs``; calls ``on_capacity`` when it grew.
    It reads updates (``delta=1``): one server changing costs the decoding of that server."""

    def apply(fleet: Fleet) -> None:
        if inputs.set_fleet(fleet):
            on_capacity()

    def followed(status: FollowStatus) -> None:
        inputs.fleet_polled(status.up)
        inputs.discovery_followed(status)

    return Follower(
        http,
        "/v1/fleet",
        name="discovery fleet",
        decode=Fleet.from_dict,
        revision=_revision,
        updates=FleetUpdate.from_dict,
        policy=policy,
        on_change=apply,
        on_status=followed,
    )


def follow_topology(
    http: httpx.AsyncClient, inputs: Inputs, *, policy: FollowPolicy = POLICY
) -> Follower[Topology]:
    """A follower of discovery's client-node topology into ``inputs``."""
    return Follower(
        http,
        "/v1/topology",
        name="discovery topology",
        decode=Topology.from_dict,
        revision=_revision,
        policy=policy,
        on_change=inputs.set_topology,
        on_status=inputs.discovery_followed,
    )


def _revision(value: Fleet | Topology) -> int:
    return value.revision
