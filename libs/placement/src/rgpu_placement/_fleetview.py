"""A decision must take about a millisecond over 1,000 servers, so
everything about the fleet that does not depend on the pod or the claims is worked out once
per fleet revision: eligibility, healthy cards sorted by memory, busy flags, label indexes,
and the best-fit order servers are tried in.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rgpu_contracts import (
    Card,
    CardId,
    Fleet,
    GpuUuid,
    Reason,
    Server,
    ServerName,
    ServerVerdict,
    Topology,
)

__all__ = ["FleetView", "Ranking", "ServerFacts", "server_facts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerFacts:
    """One server as far as it can be judged without looking at claims."""

    server: Server
    name: ServerName
    """``server.name``, kept as a field: every decision reads it for every server tried."""
    problem: Reason | None
    """Why no card of this server can be used, whatever the pod (None when eligible)."""
    detail: str
    healthy: tuple[Card, ...]
    """Healthy cards, smallest memory first (then index), so best-fit picks are prefixes."""
    memories: tuple[int, ...]
    """``healthy``'s memory sizes, ascending, for bisecting."""
    busy: frozenset[str]
    """GPU UUIDs lupine reports a client on."""
    labels: Mapping[str, str]
    """The server's topology labels, for the locality rule."""
    cordoned: frozenset[GpuUuid] = frozenset()
    """GPUs of the server under a device cordon: never booked (holders stay)."""
    cuda_major: int | None = None
    """The CUDA major lupine reported, for pods that ask for one (``None``: not known)."""

    def capable(self, memory_mib: int) -> int:
        """How many healthy cards have at least ``memory_mib``."""
        return len(self.memories) - bisect.bisect_left(self.memories, memory_mib)


def _problem(server: Server) -> tuple[Reason | None, str]:
    # A cordon comes first: it is the operator's word, and it outlasts whatever else is wrong.
    if server.cordoned:
        return Reason.SERVER_CORDONED, f"node {server.node_name} is cordoned (unschedulable)"
    if not server.ready:
        return Reason.SERVER_NOT_READY, "node is not Ready"
    if not server.endpoint:
        return Reason.SERVER_NOT_READY, f"no endpoint ({server.error or 'no InternalIP'})"
    if not server.reachable:
        return Reason.SERVER_UNREACHABLE, f"lupine at {server.endpoint} did not answer probes"
    return None, ""


def server_facts(server: Server) -> ServerFacts:
    """Work out what can be known about ``server`` before any pod asks."""
    problem, detail = _problem(server)
    healthy = tuple(sorted(server.healthy_cards, key=lambda c: (c.memory_mib, c.index, c.id)))
    busy = server.busy if server.usage_reported else frozenset()
    return ServerFacts(
        server=server,
        name=server.name,
        problem=problem,
        detail=detail,
        healthy=healthy,
        memories=tuple(c.memory_mib for c in healthy),
        busy=frozenset(busy),
        labels=dict(server.topology),
        cordoned=server.cordoned_cards,
        cuda_major=server.cuda_major,
    )


Path = tuple[str | None, ...]
"""Label values of the topology keys from one key to the coarsest (``None`` where absent)."""

Ranking = tuple[tuple[ServerFacts, ...], ...]
"""Servers by locality tier for one set of candidate profiles: one group per topology key
(finest first), then the servers sharing no domain; each group in best-fit order."""

DomainIndex = Mapping[str, Mapping[Path, frozenset[ServerName]]]
"""For one topology key: its value -> the coarser labels seen beside it -> the servers."""


def path_of(labels: Mapping[str, str], keys: Sequence[str]) -> Path:
    """``labels``' values of ``keys``, ``None`` where a label is absent."""
    return tuple(labels.get(k) for k in keys)


def _paths(node_labels: Mapping[str, Mapping[str, str]], keys: Sequence[str]) -> dict[str, Path]:
    return {node: path_of(labels, keys) for node, labels in node_labels.items()}


def _domain_index(facts: Sequence[ServerFacts], keys: Sequence[str], tier: int) -> DomainIndex:
    index: dict[str, dict[Path, set[ServerName]]] = {}
    for f in facts:
        value, *coarser = path_of(f.labels, keys[tier:])
        if value is not None:
            index.setdefault(value, {}).setdefault(tuple(coarser), set()).add(f.name)
    return {v: {p: frozenset(s) for p, s in by.items()} for v, by in index.items()}


def _reused(facts: ServerFacts | None, server: Server) -> ServerFacts:
    return facts if facts is not None and facts.server is server else server_facts(server)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetView:
    """A fleet (and the client nodes' topology) indexed for deciding."""

    fleet: Fleet
    topology_keys: tuple[str, ...]
    facts: Mapping[ServerName, ServerFacts]
    order: tuple[ServerFacts, ...]
    """Every server by (healthy cards, name): the server-granularity best-fit order."""
    domains: tuple[DomainIndex, ...]
    """Per topology key (finest first), the servers by that label and their coarser labels:
    the locality rule compares distinct label sets, not every server."""
    cards: Mapping[CardId, Card]
    server_nodes: frozenset[str]
    """The Nodes the servers run on (a Node running one lupine per GPU hosts several servers,
    none named after it): a scheduler's candidate among them is no client."""
    node_labels: Mapping[str, Mapping[str, str]]
    node_paths: Mapping[str, Path]
    """Each client node's topology path: candidates are compared by distinct paths."""
    total_cards: int
    rankings: dict[frozenset[Path], Ranking] = field(
        default_factory=dict, compare=False, repr=False
    )
    """The locality ranking per set of candidate paths, filled by ``choose`` as decisions
    need them: kube-scheduler's samples change every pod, but the paths they cover repeat,
    and ranking 1,000 servers per decision was most of a decision's cost."""
    verdicts: dict[object, dict[object, ServerVerdict]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """Server-granularity verdicts per demand and per what they were judged on, filled by
    refusals: every parked pod's retry explains the whole fleet, and little of it changes
    between two retries."""
    capable: dict[object, tuple[ServerFacts, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """Per demand and granularity, the servers (in ``order``) that could take it were nothing
    held or busy: a refusal asks which of them only claims keep from the pod, and the answer
    for the rest of the fleet is known without looking at any claim."""

    @classmethod
    def build(
        cls, fleet: Fleet, topology: Topology | None, topology_keys: Sequence[str]
    ) -> FleetView:
        """Index ``fleet`` and ``topology`` for the configured ``topology_keys`` (finest first)."""
        labels = topology.labels_of() if topology is not None else {}
        return cls._index(fleet, tuple(topology_keys), labels)

    @classmethod
    def _index(
        cls, fleet: Fleet, keys: tuple[str, ...], node_labels: Mapping[str, Mapping[str, str]]
    ) -> FleetView:
        facts = [server_facts(s) for s in fleet.servers]
        return cls._assemble(
            fleet,
            keys,
            facts,
            domains=tuple(_domain_index(facts, keys, tier) for tier in range(len(keys))),
            node_labels=node_labels,
            node_paths=_paths(node_labels, keys),
        )

    @classmethod
    def _assemble(
        cls,
        fleet: Fleet,
        keys: tuple[str, ...],
        facts: Sequence[ServerFacts],
        *,
        domains: tuple[DomainIndex, ...],
        node_labels: Mapping[str, Mapping[str, str]],
        node_paths: Mapping[str, Path],
    ) -> FleetView:
        return cls(
            fleet=fleet,
            topology_keys=keys,
            facts={f.name: f for f in facts},
            order=tuple(sorted(facts, key=lambda f: (len(f.healthy), f.name))),
            domains=domains,
            cards={c.id: c for s in fleet.servers for c in s.cards},
            # ``node_name`` inlined: a property call per server is most of this line's cost.
            server_nodes=frozenset(s.name if s.node is None else s.node for s in fleet.servers),
            node_labels=node_labels,
            node_paths=node_paths,
            total_cards=sum(len(s.cards) for s in fleet.servers),
        )

    def with_fleet(self, fleet: Fleet) -> FleetView:
        """This view for a newer ``fleet``, same topology. Servers that did not change (the
        same object: deltas keep them) keep their facts, and the locality index is kept
        while every server keeps its name and labels, so one server turning busy costs
        about one server, not the ~17 ms of indexing 1,000 servers and 5,000 nodes anew."""
        known = self.facts
        facts = [_reused(known.get(s.name), s) for s in fleet.servers]
        placed = len(facts) == len(known) and all(
            f.name in known and known[f.name].labels == f.labels for f in facts
        )
        keys = self.topology_keys
        domains = (
            self.domains
            if placed
            else tuple(_domain_index(facts, keys, tier) for tier in range(len(keys)))
        )
        return self._assemble(
            fleet,
            keys,
            facts,
            domains=domains,
            node_labels=self.node_labels,
            node_paths=self.node_paths,
        )

    def with_servers(self, fresh: Iterable[Server]) -> FleetView:
        """This view with ``fresh`` states of some of its servers (servers it does not hold
        are ignored: the fleet's membership is discovery's long-poll to change)."""
        newer = {s.name: s for s in fresh if s.name in self.facts}
        if not newer:
            return self
        servers = tuple(newer.get(s.name, s) for s in self.fleet.servers)
        return self.with_fleet(dataclasses.replace(self.fleet, servers=servers))

    def with_topology(self, topology: Topology) -> FleetView:
        """The same fleet with newer client-node labels."""
        labels = topology.labels_of()
        return FleetView(
            fleet=self.fleet,
            topology_keys=self.topology_keys,
            facts=self.facts,
            order=self.order,
            domains=self.domains,
            cards=self.cards,
            server_nodes=self.server_nodes,
            node_labels=labels,
            node_paths=_paths(labels, self.topology_keys),
            total_cards=self.total_cards,
        )
