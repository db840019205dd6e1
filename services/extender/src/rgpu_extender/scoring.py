"""Every CUDA call of a remote-GPU pod crosses the network to its
server, so among the nodes filter kept, the ones nearest the booked server are better; this
scores candidates by the finest topology domain (``RGPU_TOPOLOGY_KEYS``, finest first) they
share with the pod's claimed server, by the same nested rule the allocator chooses with.

A prioritize failure costs nothing (kube-scheduler ignores an extender's failed prioritize),
so anything short of a readable request scores every node 0 rather than failing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import anyio

from rgpu_contracts import ContractError, ExtenderArgs, HostPriority, ServerName
from rgpu_placement import FleetView, shared_level
from rgpu_runtime.errors import BadRequest
from rgpu_runtime.feeds import DiscoveryMirror

from .booked import booked_server
from .clients import AllocatorClient
from .errors import AllocatorUnavailable, PeerReplyInvalid
from .instruments import ExtenderMetrics, observed
from .objects import node_labels, node_name, pod_label, pod_ref
from .recent import RecentBookings

__all__ = ["DOMAIN_SCORES", "PrioritizeOutcome", "Scoring", "closeness"]

DOMAIN_SCORES = (10, 5, 2)
"""Score for sharing the 1st (rack), 2nd (zone) and 3rd (region) key; any further key scores 1."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PrioritizeOutcome:
    """The scores and a one-word ``outcome`` for spans and metrics."""

    priorities: tuple[HostPriority, ...]
    outcome: str
    pod: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scoring:
    """The ``/prioritize`` verb with what it scores with; built once by the lifespan."""

    allocator: AllocatorClient
    discovery: DiscoveryMirror[FleetView]
    metrics: ExtenderMetrics
    topology_keys: tuple[str, ...]
    """``RGPU_TOPOLOGY_KEYS``, finest domain first."""
    budget: float
    """Seconds the allocator may take (``RGPU_EXTENDER_BUDGET_SECONDS``)."""
    recent: RecentBookings
    """The servers this replica's ``/filter`` just booked, asked before the allocator."""
    memo: ScoreMemo = field(default_factory=lambda: ScoreMemo())
    """Scores already worked out for this fleet view."""

    async def prioritize(self, raw: object) -> PrioritizeOutcome:
        """Score the candidates in ExtenderArgs ``raw``; raises ``BadRequest`` if unreadable."""
        started = time.perf_counter()
        try:
            args = ExtenderArgs.from_dict(raw)
        except ContractError as exc:
            raise BadRequest(f"invalid ExtenderArgs: {exc}") from exc
        return await observed("prioritize", self.metrics, self._prioritize(args), started)

    async def _prioritize(self, args: ExtenderArgs) -> PrioritizeOutcome:
        server_labels, outcome = await self._claimed_server_labels(args)
        if server_labels is None:
            return _flat(args, outcome)
        names, keys = args.candidate_names(), self.topology_keys
        view = self.discovery.view
        if args.nodes is not None or view is None:
            priorities = _by_profile(server_labels, self._candidate_labels(args), names, keys)
        else:
            priorities = self.memo.scores(view, server_labels, names, keys)
        return PrioritizeOutcome(priorities=priorities, outcome="scored", pod=pod_label(args.pod))

    async def _claimed_server_labels(
        self, args: ExtenderArgs
    ) -> tuple[Mapping[str, str] | None, str]:
        uid = pod_ref(args.pod).uid
        fleet = self.discovery.view
        if not uid or fleet is None:
            return None, "not_synced" if uid else "no_claim"
        booked = booked_server(args.pod, time.time()) or self.recent.server_of(uid)
        if booked is None:
            try:
                with anyio.fail_after(self.budget):
                    allocation = await self.allocator.find(uid)
            except (TimeoutError, AllocatorUnavailable, PeerReplyInvalid):
                return None, "allocator_error"
            if allocation is None:
                return None, "no_claim"
            booked = allocation.server
        facts = fleet.facts.get(ServerName(booked))
        if facts is None:
            return None, "server_unknown"
        return dict(facts.server.topology), "scored"

    def _candidate_labels(self, args: ExtenderArgs) -> Mapping[str, Mapping[str, str]]:
        # Full Nodes carry their own labels, fresher than discovery's copy.
        if args.nodes is not None:
            return {node_name(n): node_labels(n) for n in args.nodes.get("items") or ()}
        fleet = self.discovery.view
        return fleet.node_labels if fleet is not None else {}


def _by_profile(
    server: Mapping[str, str],
    labels: Mapping[str, Mapping[str, str]],
    names: Iterable[str],
    keys: Sequence[str],
) -> tuple[HostPriority, ...]:
    """Each candidate's closeness, worked out once per distinct label set: hundreds of
    candidates share a handful of (rack, zone, region) profiles."""
    scores: dict[tuple[str | None, ...], int] = {}
    priorities = []
    for name in names:
        node = labels.get(name) or {}
        profile = tuple(node.get(k) for k in keys)
        score = scores.get(profile)
        if score is None:
            score = scores[profile] = closeness(server, node, keys)
        priorities.append(HostPriority(host=name, score=score))
    return tuple(priorities)


MEMO_KEPT = 64
"""Score lists kept per fleet view: one per (booked server's topology, candidate set)."""


class ScoreMemo:
    """The scores of one candidate set for one booked server's topology, kept while the fleet
    view (node labels included) stays the same.

    kube-scheduler sends every pod of a burst the same candidates (the client nodes filter
    kept), and the servers booked for them share a few (rack, zone, region) profiles, so the
    2,000-node score list of one pod is, nearly always, the next pod's too: it was a sixth of
    the extender's CPU in a 1,000-server burst.
    """

    __slots__ = ("_scores", "_view")

    def __init__(self) -> None:
        self._view: FleetView | None = None
        self._scores: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[HostPriority, ...]]
        self._scores = {}

    def scores(
        self,
        view: FleetView,
        server: Mapping[str, str],
        names: tuple[str, ...],
        keys: Sequence[str],
    ) -> tuple[HostPriority, ...]:
        if view is not self._view:
            self._view, self._scores = view, {}
        key = (tuple(server.get(k) or "" for k in keys), names)
        found = self._scores.get(key)
        if found is None:
            found = _by_profile(server, view.node_labels, names, keys)
            if len(self._scores) >= MEMO_KEPT:
                self._scores.clear()
            self._scores[key] = found
        return found


def _flat(args: ExtenderArgs, outcome: str) -> PrioritizeOutcome:
    priorities = tuple(HostPriority(host=n, score=0) for n in args.candidate_names())
    return PrioritizeOutcome(priorities=priorities, outcome=outcome, pod=pod_label(args.pod))


def closeness(server: Mapping[str, str], node: Mapping[str, str], keys: Sequence[str]) -> int:
    """Score 0..10 for the finest domain ``node`` shares with ``server`` under the nested
    locality rule the allocator chooses by (``rgpu_placement.shared_level``)."""
    level = shared_level(server, node, keys)
    if level is None:
        return 0
    return DOMAIN_SCORES[level] if level < len(DOMAIN_SCORES) else 1
