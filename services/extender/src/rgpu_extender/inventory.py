"""Filter must know which nodes are GPU servers and prioritize must know
every node's topology, on kube-scheduler's serial hot path, without a call per pod. The
extender follows discovery's fleet and topology by long-poll in the background
(``rgpu_runtime.Follower``) and keeps the latest of each, indexed for lookups, here.

Until the first fleet arrives the extender cannot tell servers from clients, so ``fleet`` is
``None`` and filter answers with ``Error`` (kube-scheduler backs off and retries).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import anyio
import httpx

from rgpu_contracts import Fleet, FleetUpdate, Server, Topology
from rgpu_runtime import Follower, FollowPolicy, FollowStatus, Versioned

__all__ = ["POLICY", "FleetView", "Inventory", "TopologyView"]

POLICY: Final = FollowPolicy(wait_seconds=30.0, margin_seconds=5.0)
"""Discovery may hold a poll 30 s (changes arrive at once, this only bounds idle polls); 5 s
more and the call counts as hung. Pauses and backoff are ``rgpu_runtime.Follower``'s."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetView:
    """A fleet with its servers indexed by name, and the Nodes they run on (a Node running
    one lupine per GPU hosts several servers, none named after it)."""

    fleet: Fleet
    servers: Mapping[str, Server]
    nodes: frozenset[str] = frozenset()

    @classmethod
    def of(cls, fleet: Fleet) -> FleetView:
        return cls(
            fleet=fleet,
            servers=MappingProxyType({s.name: s for s in fleet.servers}),
            nodes=frozenset(s.node_name for s in fleet.servers),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyView:
    """Client nodes' topology labels indexed by node name."""

    revision: int
    labels: Mapping[str, Mapping[str, str]]

    @classmethod
    def of(cls, topology: Topology) -> TopologyView:
        labels: dict[str, Mapping[str, str]] = {
            node.name: MappingProxyType(dict(node.labels)) for node in topology.nodes
        }
        return cls(revision=topology.revision, labels=MappingProxyType(labels))


class Inventory:
    """The latest fleet and topology from discovery; ``None`` until first received."""

    __slots__ = ("_asked", "_policy", "_statuses", "_waiting", "fleet_store", "topology_store")

    def __init__(self, *, policy: FollowPolicy = POLICY) -> None:
        self.fleet_store: Versioned[FleetView | None] = Versioned(None, revision=0)
        self.topology_store: Versioned[TopologyView | None] = Versioned(None, revision=0)
        self._policy = policy
        self._waiting = {"fleet", "topology"}
        self._asked = anyio.Event()
        self._statuses: dict[str, FollowStatus] = {}

    async def asked_once(self) -> None:
        """Return once discovery answered, or failed, the first call for each of the two.

        The lifespan waits for this, not for the followers' "started" (their first answer):
        with discovery up the extender serves with a fleet from its first request, and with
        discovery down it still serves, answering filter with ``Error`` until the fleet comes.
        """
        await self._asked.wait()

    @property
    def fleet(self) -> FleetView | None:
        return self.fleet_store.value

    @property
    def topology(self) -> TopologyView | None:
        return self.topology_store.value

    def followers(self, http: httpx.AsyncClient) -> tuple[Follower[Fleet], Follower[Topology]]:
        """The two long-polls that keep ``fleet`` and ``topology`` current, over discovery's
        client ``http``; run each in the lifespan's task group."""
        fleet = Follower(
            http,
            "/v1/fleet",
            name="discovery fleet",
            decode=Fleet.from_dict,
            revision=_revision,
            updates=FleetUpdate.from_dict,
            policy=self._policy,
            on_change=lambda value: self.fleet_store.publish(FleetView.of(value)),
            on_status=lambda status: self._called("fleet", status),
        )
        topology = Follower(
            http,
            "/v1/topology",
            name="discovery topology",
            decode=Topology.from_dict,
            revision=_revision,
            policy=self._policy,
            on_change=lambda value: self.topology_store.publish(TopologyView.of(value)),
            on_status=lambda status: self._called("topology", status),
        )
        return fleet, topology

    def age(self, what: str) -> float:
        """Seconds since discovery last answered the ``what`` long-poll (``fleet`` or
        ``topology``); infinite before the first answer, so a stale view is visible."""
        status = self._statuses.get(what)
        age = None if status is None else status.age(time.monotonic())
        return math.inf if age is None else age

    def _called(self, what: str, status: FollowStatus) -> None:
        self._statuses[what] = status
        self._waiting.discard(what)
        if not self._waiting:
            self._asked.set()


def _revision(value: Fleet | Topology) -> int:
    return value.revision
