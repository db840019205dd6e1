"""Filter must know which nodes are GPU servers and prioritize must know
every node's topology, on kube-scheduler's serial hot path, without a call per pod. The
extender follows discovery's fleet and topology by long-poll in the background and keeps the
latest of each, indexed for lookups, here.

Until the first fleet arrives the extender cannot tell servers from clients, so ``fleet`` is
``None`` and filter answers with ``Error`` (kube-scheduler backs off and retries).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts import Fleet, Server, Topology
from rgpu_runtime import Backoff, Versioned

from .discovery_client import DiscoveryClient
from .errors import DiscoveryUnavailable, PeerReplyInvalid

__all__ = ["LONG_POLL_SECONDS", "FleetView", "Inventory", "TopologyView"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

LONG_POLL_SECONDS = 30.0
"""Seconds discovery may hold a poll open; changes arrive at once, this only bounds idle polls."""

UNCHANGED_PAUSE_SECONDS = 0.05
"""Pause after a poll that brought nothing new, so a peer that answers at once without
waiting cannot make the loop spin; after a held poll this delay is lost in the noise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetView:
    """A fleet with its servers indexed by node name."""

    fleet: Fleet
    servers: Mapping[str, Server]

    @classmethod
    def of(cls, fleet: Fleet) -> FleetView:
        return cls(fleet=fleet, servers=MappingProxyType({s.name: s for s in fleet.servers}))


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

    __slots__ = ("_backoff", "fleet_store", "topology_store")

    def __init__(self, *, backoff: Backoff | None = None) -> None:
        self.fleet_store: Versioned[FleetView | None] = Versioned(None, revision=0)
        self.topology_store: Versioned[TopologyView | None] = Versioned(None, revision=0)
        self._backoff = backoff or Backoff(initial=0.2, maximum=5.0)

    @property
    def fleet(self) -> FleetView | None:
        return self.fleet_store.value

    @property
    def topology(self) -> TopologyView | None:
        return self.topology_store.value

    async def follow_fleet(self, client: DiscoveryClient, *, task_status: TaskStatus[None]) -> None:
        """Keep ``fleet`` current; reports started after the first attempt, whatever its result."""
        await self._follow(
            "fleet",
            client.fleet,
            lambda fleet: fleet.revision,
            lambda fleet: self.fleet_store.publish(FleetView.of(fleet)),
            task_status,
        )

    async def follow_topology(
        self, client: DiscoveryClient, *, task_status: TaskStatus[None]
    ) -> None:
        """Keep ``topology`` current, as ``follow_fleet`` does the fleet."""
        await self._follow(
            "topology",
            client.topology,
            lambda topology: topology.revision,
            lambda topology: self.topology_store.publish(TopologyView.of(topology)),
            task_status,
        )

    async def _follow(
        self,
        what: str,
        fetch: Callable[[int | None, float], Awaitable[T]],
        revision_of: Callable[[T], int],
        publish: Callable[[T], object],
        task_status: TaskStatus[None],
    ) -> None:
        since: int | None = None
        failures = 0
        started = False
        while True:
            value = await _poll(what, fetch, since, quiet=failures > 0)
            previous = since
            if value is None:
                failures += 1
            else:
                since, failures = self._accept(what, value, since, revision_of, publish), 0
            if not started:
                started = True
                task_status.started()
            if failures:
                await anyio.sleep(self._backoff.delay(failures - 1))
            elif since == previous:
                await anyio.sleep(UNCHANGED_PAUSE_SECONDS)

    @staticmethod
    def _accept(
        what: str,
        value: T,
        since: int | None,
        revision_of: Callable[[T], int],
        publish: Callable[[T], object],
    ) -> int:
        revision = revision_of(value)
        if revision != since:
            publish(value)
            logger.debug("discovery's %s is now at revision %d", what, revision)
        return revision


async def _poll(
    what: str, fetch: Callable[[int | None, float], Awaitable[T]], since: int | None, *, quiet: bool
) -> T | None:
    try:
        return await fetch(since, LONG_POLL_SECONDS if since is not None else 0.0)
    except (DiscoveryUnavailable, PeerReplyInvalid) as exc:
        # Log the first failure of a run only; the retries repeat it every few seconds.
        if not quiet:
            logger.warning("cannot follow discovery's %s, retrying: %s", what, exc.message)
        return None
