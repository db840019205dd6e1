"""``/filter`` is where a GPU pod gets its server on kube-scheduler's serial hot path: read
from the booking admission made (the pod passed rgpu's scheduling gate), or, in HAMi's flow
and for pods that were never gated, booked here, once per pod. It must answer every pod
within the budget, send unfixable pods to ``FailedAndUnresolvableNodes`` (no preemption can
help them), keep GPU servers free of client pods, and tell "no GPU fits now"
(``FailedNodes``: the pod waits) from "we could not decide" (``Error``: kube-scheduler backs
off and asks again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

import rgpu_placement as placement
from rgpu_contracts import (
    AllocationRequest,
    ContractError,
    ExtenderArgs,
    ExtenderFilterResult,
    NodeName,
    NoFit,
    PodRef,
    ServerName,
)
from rgpu_placement import FleetView, PodDemand, read_demand
from rgpu_runtime.feeds import DiscoveryMirror
from rgpu_runtime.kube import EventRecorder
from rgpu_runtime.settings import ResourceSettings

from .booked import booked_server
from .clients import AllocatorClient
from .container_env import check_wired
from .errors import AllocatorUnavailable, InvalidQuantity, PeerReplyInvalid, PodNotServable
from .events import UNAVAILABLE, pod_event
from .instruments import ExtenderMetrics, observed
from .objects import node_name, pod_label, pod_ref
from .recent import RecentBookings

__all__ = ["SERVER_NODE_REASON", "FilterOutcome", "Filtering"]

logger = logging.getLogger(__name__)

SERVER_NODE_REASON = (
    "node serves the remote GPU pool (hami.io/lupine-server); GPU clients run elsewhere"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterOutcome:
    """The reply and a one-word ``outcome`` for spans and metrics."""

    result: ExtenderFilterResult
    outcome: str
    pod: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Filtering:
    """The ``/filter`` verb with what it decides with; built once by the lifespan."""

    allocator: AllocatorClient
    discovery: DiscoveryMirror[FleetView]
    events: EventRecorder
    metrics: ExtenderMetrics
    resources: ResourceSettings
    budget: float
    """Seconds the allocator may take (``RGPU_EXTENDER_BUDGET_SECONDS``)."""
    recent: RecentBookings
    """Where each booking is noted for the ``/prioritize`` that follows."""

    async def filter_pod(self, raw: object) -> FilterOutcome:
        """Decide ``/filter`` for the ExtenderArgs ``raw``; never raises for bad input."""
        return await observed("filter", self.metrics, self._filter(raw), time.perf_counter())

    def unreadable(self, message: str) -> FilterOutcome:
        """The reply to a body that is not JSON at all (filter still answers 200 with ``Error``)."""
        self.metrics.verb_done("filter", "malformed", 0.0)
        return _error("malformed", message)

    async def _filter(self, raw: object) -> FilterOutcome:
        try:
            args = ExtenderArgs.from_dict(raw)
        except ContractError as exc:
            return _error("malformed", f"invalid ExtenderArgs: {exc}")
        label = pod_label(args.pod)
        try:
            demand = self._demand(args.pod)
        except PodNotServable as exc:
            self._tell(pod_ref(args.pod), exc.message)
            return _unresolvable(args, exc.message, exc.code, label)
        if not demand.asks:
            return FilterOutcome(result=_keep(args, args.candidate_names()), outcome="no_request")
        return await self._place(args, demand, label)

    def _demand(self, pod: Mapping[str, Any]) -> PodDemand:
        count, memory = self.resources.count, self.resources.memory
        try:
            demand = read_demand(pod, count_resource=count, memory_resource=memory)
        except placement.InvalidQuantity as exc:
            raise InvalidQuantity.wrapping(exc) from exc
        if demand.asks:
            check_wired(pod, demand)
        return demand

    async def _place(self, args: ExtenderArgs, demand: PodDemand, label: str) -> FilterOutcome:
        fleet = self.discovery.view
        if fleet is None:
            message = "remote GPU inventory not synced yet (no fleet from discovery); retrying"
            return _error("not_synced", message, label)
        ref = pod_ref(args.pod)
        if not ref.uid:
            message = f"pod {label} has no metadata.uid; cannot book a server"
            return _error("malformed", message, label)
        servers, clients = _split(args.candidate_names(), fleet)
        if not clients:
            return _outcome(args, (), (), servers, "no_client_nodes", label)
        booked = booked_server(args.pod, time.time())
        if booked is not None and ServerName(booked) in fleet.facts:
            # Admitted: the booking written on the pod stands, kube-scheduler only places it.
            self.recent.remember(ref.uid, booked)
            return _outcome(args, clients, (), servers, "booked", label)
        request = AllocationRequest(
            pod=ref,
            containers=demand.requests(),
            candidate_nodes=clients,
            cuda_major=demand.cuda_major,
        )
        try:
            with anyio.fail_after(self.budget):
                answer = await self.allocator.allocate(request)
        except TimeoutError:
            message = f"allocator did not answer within {self.budget:g}s; retrying"
            logger.warning("filter of pod %s: %s", label, message)
            return _error("timeout", message, label)
        except (AllocatorUnavailable, PeerReplyInvalid) as exc:
            logger.warning("filter of pod %s: %s", label, exc.message)
            return _error("allocator_error", exc.message, label)
        if isinstance(answer, NoFit):
            self.recent.forget(ref.uid)
            self._tell(ref, answer.message)
            failed = tuple((node, answer.message) for node in clients)
            return _outcome(args, (), failed, servers, "no_fit", label)
        self.recent.remember(ref.uid, answer.server)
        return _outcome(args, clients, (), servers, "fit", label)

    def _tell(self, pod: PodRef, message: str) -> None:
        self.events.record(pod_event(pod=pod, reason=UNAVAILABLE, message=message, warning=True))


def _error(outcome: str, message: str, pod: str = "") -> FilterOutcome:
    return FilterOutcome(result=ExtenderFilterResult(error=message), outcome=outcome, pod=pod)


def _split(
    candidates: Iterable[str], fleet: FleetView
) -> tuple[tuple[str, ...], tuple[NodeName, ...]]:
    servers = tuple(node for node in candidates if node in fleet.server_nodes)
    clients = tuple(NodeName(node) for node in candidates if node not in fleet.server_nodes)
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
    items = [n for n in args.nodes.get("items") or () if node_name(n) in wanted]
    return ExtenderFilterResult(nodes={**args.nodes, "items": items})
