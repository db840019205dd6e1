"""Every CUDA call of a remote-GPU pod crosses the network to its
server, so among the nodes filter kept, the ones nearest the booked server are better; this
scores candidates by the finest topology domain (``RGPU_TOPOLOGY_KEYS``, finest first) they
share with the pod's claimed server, by the same nested rule the allocator chooses with.

A prioritize failure costs nothing (kube-scheduler ignores an extender's failed prioritize),
so anything short of a readable request scores every node 0 rather than failing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from opentelemetry import trace

from rgpu_contracts import ContractError, ExtenderArgs, HostPriority
from rgpu_placement import shared_level
from rgpu_runtime import BadRequest

from .deps import Deps
from .errors import AllocatorUnavailable, PeerReplyInvalid
from .pods import mapping, pod_label, pod_ref

__all__ = ["DOMAIN_SCORES", "PrioritizeOutcome", "closeness", "prioritize"]

tracer = trace.get_tracer(__name__)

DOMAIN_SCORES = (10, 5, 2)
"""Score for sharing the 1st (rack), 2nd (zone) and 3rd (region) key; any further key scores 1."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PrioritizeOutcome:
    """The scores and a one-word ``outcome`` for spans and metrics."""

    priorities: tuple[HostPriority, ...]
    outcome: str
    pod: str = ""


async def prioritize(raw: object, deps: Deps) -> PrioritizeOutcome:
    """Score the candidates in ExtenderArgs ``raw``; raises ``BadRequest`` if unreadable."""
    started = time.perf_counter()
    try:
        args = ExtenderArgs.from_dict(raw)
    except ContractError as exc:
        raise BadRequest(f"invalid ExtenderArgs: {exc}") from exc
    with tracer.start_as_current_span("extender.prioritize") as span:
        outcome = await _prioritize(args, deps)
        span.set_attribute("k8s.pod", outcome.pod)
        span.set_attribute("rgpu.outcome", outcome.outcome)
    deps.metrics.verb_done("prioritize", outcome.outcome, time.perf_counter() - started)
    return outcome


def _flat(args: ExtenderArgs, outcome: str) -> PrioritizeOutcome:
    priorities = tuple(HostPriority(host=n, score=0) for n in args.candidate_names())
    return PrioritizeOutcome(priorities=priorities, outcome=outcome, pod=pod_label(args.pod))


async def _prioritize(args: ExtenderArgs, deps: Deps) -> PrioritizeOutcome:
    server_labels, outcome = await _claimed_server_labels(args, deps)
    if server_labels is None:
        return _flat(args, outcome)
    keys = deps.settings.scheduling.topology_keys
    labels = _candidate_labels(args, deps)
    priorities = tuple(
        HostPriority(host=name, score=closeness(server_labels, labels.get(name, {}), keys))
        for name in args.candidate_names()
    )
    return PrioritizeOutcome(priorities=priorities, outcome="scored", pod=pod_label(args.pod))


async def _claimed_server_labels(
    args: ExtenderArgs, deps: Deps
) -> tuple[Mapping[str, str] | None, str]:
    uid = pod_ref(args.pod).uid
    fleet = deps.inventory.fleet
    if not uid or fleet is None:
        return None, "not_synced" if uid else "no_claim"
    try:
        with anyio.fail_after(deps.budget):
            allocation = await deps.allocator.find(uid)
    except (TimeoutError, AllocatorUnavailable, PeerReplyInvalid):
        return None, "allocator_error"
    if allocation is None:
        return None, "no_claim"
    server = fleet.servers.get(allocation.server)
    if server is None:
        return None, "server_unknown"
    return dict(server.topology), "scored"


def _candidate_labels(args: ExtenderArgs, deps: Deps) -> Mapping[str, Mapping[str, str]]:
    # Full Nodes carry their own labels, fresher than discovery's copy.
    if args.nodes is not None:
        return {_name(n): _labels(n) for n in args.nodes.get("items") or ()}
    topology = deps.inventory.topology
    return topology.labels if topology is not None else {}


def _name(node: object) -> str:
    return str(mapping(mapping(node).get("metadata")).get("name", ""))


def _labels(node: object) -> Mapping[str, str]:
    labels: Mapping[str, Any] = mapping(mapping(mapping(node).get("metadata")).get("labels"))
    return {str(k): str(v) for k, v in labels.items()}


def closeness(server: Mapping[str, str], node: Mapping[str, str], keys: Sequence[str]) -> int:
    """Score 0..10 for the finest domain ``node`` shares with ``server`` under the nested
    locality rule the allocator chooses by (``rgpu_placement.shared_level``)."""
    level = shared_level(server, node, keys)
    if level is None:
        return 0
    return DOMAIN_SCORES[level] if level < len(DOMAIN_SCORES) else 1
