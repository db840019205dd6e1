"""``/filter`` is where a GPU pod is booked a server, once per pod,
serially, on kube-scheduler's hot path. It must answer every pod within the budget, send
unfixable pods to ``FailedAndUnresolvableNodes`` (no preemption can help them), keep GPU
servers free of client pods, and tell "no GPU fits now" (``FailedNodes``: the pod waits) from
"we could not decide" (``Error``: kube-scheduler backs off and asks again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from opentelemetry import trace

import rgpu_placement as placement
from rgpu_contracts import (
    AllocationRequest,
    ContractError,
    ExtenderArgs,
    ExtenderFilterResult,
    NodeName,
    NoFit,
    PodRef,
)
from rgpu_placement import PodDemand, read_demand

from .deps import Deps
from .errors import AllocatorUnavailable, InvalidQuantity, PeerReplyInvalid, PodNotServable
from .events import UNAVAILABLE, pod_event
from .inventory import FleetView
from .pods import pod_label, pod_ref
from .wiring import check_wired

__all__ = ["SERVER_NODE_REASON", "FilterOutcome", "filter_pod", "unreadable"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

SERVER_NODE_REASON = (
    "node serves the remote GPU pool (hami.io/lupine-server); GPU clients run elsewhere"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterOutcome:
    """The reply and a one-word ``outcome`` for spans and metrics."""

    result: ExtenderFilterResult
    outcome: str
    pod: str = ""


async def filter_pod(raw: object, deps: Deps) -> FilterOutcome:
    """Decide ``/filter`` for the ExtenderArgs ``raw``; never raises for bad input."""
    started = time.perf_counter()
    with tracer.start_as_current_span("extender.filter") as span:
        outcome = await _filter(raw, deps)
        span.set_attribute("k8s.pod", outcome.pod)
        span.set_attribute("rgpu.outcome", outcome.outcome)
    deps.metrics.verb_done("filter", outcome.outcome, time.perf_counter() - started)
    return outcome


def unreadable(message: str, deps: Deps) -> FilterOutcome:
    """The reply to a body that is not JSON at all (filter still answers 200 with ``Error``)."""
    deps.metrics.verb_done("filter", "malformed", 0.0)
    return _error("malformed", message)


def _error(outcome: str, message: str, pod: str = "") -> FilterOutcome:
    return FilterOutcome(result=ExtenderFilterResult(error=message), outcome=outcome, pod=pod)


async def _filter(raw: object, deps: Deps) -> FilterOutcome:
    try:
        args = ExtenderArgs.from_dict(raw)
    except ContractError as exc:
        return _error("malformed", f"invalid ExtenderArgs: {exc}")
    label = pod_label(args.pod)
    try:
        demand = _demand(args.pod, deps)
    except PodNotServable as exc:
        _tell(deps, pod_ref(args.pod), exc.message)
        return _unresolvable(args, exc.message, exc.code, label)
    if not demand.asks:
        return FilterOutcome(result=_keep(args, args.candidate_names()), outcome="no_request")
    return await _place(args, demand, deps, label)


def _demand(pod: Mapping[str, Any], deps: Deps) -> PodDemand:
    resources = deps.settings.resources
    try:
        demand = read_demand(pod, count_resource=resources.count, memory_resource=resources.memory)
    except placement.InvalidQuantity as exc:
        raise InvalidQuantity.wrapping(exc) from exc
    if demand.asks:
        check_wired(pod, demand)
    return demand


async def _place(args: ExtenderArgs, demand: PodDemand, deps: Deps, label: str) -> FilterOutcome:
    fleet = deps.inventory.fleet
    if fleet is None:
        message = "remote GPU inventory not synced yet (no fleet from discovery); retrying"
        return _error("not_synced", message, label)
    ref = pod_ref(args.pod)
    if not ref.uid:
        return _error("malformed", f"pod {label} has no metadata.uid; cannot book a server", label)
    servers, clients = _split(args.candidate_names(), fleet)
    if not clients:
        return _outcome(args, (), (), servers, "no_client_nodes", label)
    request = AllocationRequest(pod=ref, containers=demand.requests(), candidate_nodes=clients)
    try:
        with anyio.fail_after(deps.budget):
            answer = await deps.allocator.allocate(request)
    except TimeoutError:
        message = f"allocator did not answer within {deps.budget:g}s; retrying"
        logger.warning("filter of pod %s: %s", label, message)
        return _error("timeout", message, label)
    except (AllocatorUnavailable, PeerReplyInvalid) as exc:
        logger.warning("filter of pod %s: %s", label, exc.message)
        return _error("allocator_error", exc.message, label)
    if isinstance(answer, NoFit):
        _tell(deps, ref, answer.message)
        failed = tuple((node, answer.message) for node in clients)
        return _outcome(args, (), failed, servers, "no_fit", label)
    return _outcome(args, clients, (), servers, "fit", label)


def _split(
    candidates: Iterable[str], fleet: FleetView
) -> tuple[tuple[str, ...], tuple[NodeName, ...]]:
    servers = tuple(node for node in candidates if node in fleet.servers)
    clients = tuple(NodeName(node) for node in candidates if node not in fleet.servers)
    return servers, clients


def _outcome(
    args: ExtenderArgs,
    keep: tuple[str, ...],
    failed: tuple[tuple[str, str], ...],
    servers: tuple[str, ...],
    outcome: str,
    label: str,
) -> FilterOutcome:
    kept = _keep(args, keep)
    result = ExtenderFilterResult(
        node_names=kept.node_names,
        nodes=kept.nodes,
        failed_nodes=failed,
        failed_and_unresolvable=tuple((node, SERVER_NODE_REASON) for node in servers),
    )
    return FilterOutcome(result=result, outcome=outcome, pod=label)


def _unresolvable(args: ExtenderArgs, message: str, outcome: str, label: str) -> FilterOutcome:
    kept = _keep(args, ())
    result = ExtenderFilterResult(
        node_names=kept.node_names,
        nodes=kept.nodes,
        failed_and_unresolvable=tuple((node, message) for node in args.candidate_names()),
    )
    return FilterOutcome(result=result, outcome=outcome, pod=label)


def _keep(args: ExtenderArgs, names: Iterable[str]) -> ExtenderFilterResult:
    """Answer in the form kube-scheduler asked in: ``NodeNames``, or ``Nodes`` filtered."""
    if args.nodes is None:
        return ExtenderFilterResult(node_names=tuple(names))
    wanted = set(names)
    items = [n for n in args.nodes.get("items") or () if _node_name(n) in wanted]
    return ExtenderFilterResult(nodes={**args.nodes, "items": items})


def _node_name(node: object) -> str:
    meta = node.get("metadata") if isinstance(node, Mapping) else None
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


def _tell(deps: Deps, pod: PodRef, message: str) -> None:
    deps.events.record(pod_event(pod=pod, reason=UNAVAILABLE, message=message, warning=True))
