"""The allocator and the extender both decide on discovery's fleet and the client nodes'
topology, indexed for lookups (``rgpu_placement.FleetView``), on their hot paths and without a
call per decision, so both follow discovery the same way: through one ``DiscoveryMirror``.

It mirrors the two feeds (``FLEET_FEED``, read as updates, and ``TOPOLOGY_FEED``) and keeps the
index built from them current change by change: a new fleet re-indexes what changed
(``with_fleet``), new labels only the client nodes (``with_topology``). Until the first fleet
arrives ``view`` is ``None``: the service cannot tell servers from clients yet and says so
(the allocator refuses with ``FleetUnknown``, the extender's filter answers ``Error``, and
kube-scheduler retries). When discovery goes away the last fleet stays in use; how old it
may be is ``fleet_age()``, why the last call failed is ``error``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, Self, TypeVar

import httpx

from rgpu_contracts import Fleet, Topology

from ._feed import FLEET_FEED, TOPOLOGY_FEED
from ._follower import Follower, FollowPolicy
from ._mirror import FollowStatus, Mirror

__all__ = ["DiscoveryMirror", "FleetIndex"]


class FleetIndex(Protocol):
    """What a service decides with, built from the fleet and the topology
    (``rgpu_placement.FleetView``), and rebuilt from the one it replaces."""

    def with_fleet(self, fleet: Fleet) -> Self:
        """This index for a newer fleet, same topology."""
        ...

    def with_topology(self, topology: Topology) -> Self:
        """This index with newer client-node labels, same fleet."""
        ...


X = TypeVar("X", bound=FleetIndex)


class DiscoveryMirror(Generic[X]):
    """Discovery's fleet and topology as last taken, and the index ``build`` made of them.

    ``build(fleet, topology, topology_keys)`` indexes the first fleet (``FleetView.build``);
    every later change goes through the index's own ``with_fleet``/``with_topology``.
    ``clock`` is the followers' (monotonic seconds), which the ages are read on.
    """

    __slots__ = ("_build", "_clock", "_keys", "_on_fleet", "error", "fleet", "topology", "view")

    def __init__(
        self,
        build: Callable[[Fleet, Topology | None, Sequence[str]], X],
        *,
        topology_keys: Sequence[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._build = build
        self._keys = tuple(topology_keys)
        self._clock = clock
        self._on_fleet: Callable[[X | None, X], object] | None = None
        self.fleet: Mirror[Fleet] = Mirror(
            FLEET_FEED, name="discovery fleet", on_change=self._fleet, on_status=self._called
        )
        self.topology: Mirror[Topology] = Mirror(
            TOPOLOGY_FEED,
            name="discovery topology",
            on_change=self._topology,
            on_status=self._called,
        )
        self.view: X | None = None
        """The index of the latest fleet and topology; ``None`` until the first fleet."""
        self.error: str | None = None
        """Why the last call to discovery failed; ``None`` once it answers again."""

    def on_fleet(self, hook: Callable[[X | None, X], object]) -> None:
        """Call ``hook(old, new)`` with the index before and after each fleet taken (the
        allocator wakes refused pods when capacity grew)."""
        self._on_fleet = hook

    def followers(
        self, http: httpx.AsyncClient, *, policy: FollowPolicy | None = None
    ) -> tuple[Follower[Fleet], Follower[Topology]]:
        """The two long-polls that keep this mirror current over discovery's client ``http``;
        run each in the lifespan's task group (``start_soon``: deciding waits for the first
        fleet itself, starting must not)."""
        return (
            Follower(http, self.fleet, policy=policy, clock=self._clock),
            Follower(http, self.topology, policy=policy, clock=self._clock),
        )

    async def asked_once(self) -> None:
        """Return once discovery answered, or failed, the first call of each long-poll: with
        discovery up the service then decides with a fleet from its first request, and with
        discovery down it still serves."""
        await self.fleet.status.asked.wait()
        await self.topology.status.asked.wait()

    def fleet_age(self) -> float | None:
        """Seconds the fleet may be out of date: 0 while discovery holds our long-poll (it
        answers the moment anything changes), else the time since it last answered;
        ``None`` before the first fleet."""
        if self.fleet.value is None:
            return None
        if self.fleet.status.up:
            return 0.0
        return self.fleet.age(self._clock())

    def age(self, stream: str) -> float:
        """Seconds since discovery last answered the ``stream`` long-poll (``fleet`` or
        ``topology``); infinite before the first answer, so a stale view is visible."""
        status = {"fleet": self.fleet.status, "topology": self.topology.status}[stream]
        age = status.age(self._clock())
        return math.inf if age is None else age

    def _fleet(self, fleet: Fleet) -> None:
        old = self.view
        topology = self.topology.value
        self.view = (
            self._build(fleet, topology, self._keys) if old is None else old.with_fleet(fleet)
        )
        if self._on_fleet is not None:
            self._on_fleet(old, self.view)

    def _topology(self, topology: Topology) -> None:
        if self.view is not None:
            self.view = self.view.with_topology(topology)

    def _called(self, status: FollowStatus) -> None:
        self.error = status.last_error or None
