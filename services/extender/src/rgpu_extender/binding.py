"""Bind turns a booked claim into a placed pod, and its two writes (the
allocator's commit, the apiserver's Binding) must leave no half-state behind: a pod bound
without its endpoint annotation cannot reach its GPU, and a claim kept for a pod that was not
bound blocks a server until the booking expires.

So the committed annotations ride on the Binding itself (the apiserver merges them into the pod
in the same update as ``nodeName``), a failed Binding releases the claim at once, and a Binding
whose outcome is unknown (no answer) is checked by reading the pod back before anything is
released — releasing the claim of a pod that did get bound would hand its server to another.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

import anyio
from opentelemetry import trace

from rgpu_contracts import (
    ANNOTATION_ENDPOINT,
    Allocation,
    ContractError,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    PodRef,
    PodUID,
)
from rgpu_placement import InvalidQuantity, read_demand
from rgpu_runtime import KubeConflict, KubeError, KubeUnavailable

from .deps import Deps
from .errors import AllocatorUnavailable, ClaimNotHeld, PeerReplyInvalid, PodNotServable
from .events import ALLOCATED, BIND_FAILED, pod_event
from .pods import mapping

__all__ = ["BindOutcome", "bind_pod", "bound_node", "unreadable"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

_ASSIGNED = re.compile(r'already assigned to node "?([^"\s]+)"?')


@dataclass(frozen=True, slots=True, kw_only=True)
class BindOutcome:
    """The reply and a one-word ``outcome`` for spans and metrics."""

    result: ExtenderBindingResult
    outcome: str
    pod: str = ""


def bound_node(message: str) -> str | None:
    """The node named in the apiserver's "already assigned to node ..." conflict, if any."""
    match = _ASSIGNED.search(message)
    return match.group(1) if match else None


async def bind_pod(raw: object, deps: Deps) -> BindOutcome:
    """Decide ``/bind`` for the ExtenderBindingArgs ``raw``; never raises for bad input."""
    started = time.perf_counter()
    with tracer.start_as_current_span("extender.bind") as span:
        outcome = await _bind(raw, deps)
        span.set_attribute("k8s.pod", outcome.pod)
        span.set_attribute("rgpu.outcome", outcome.outcome)
    deps.metrics.verb_done("bind", outcome.outcome, time.perf_counter() - started)
    return outcome


def _cleanup_seconds(deps: Deps) -> float:
    # Kept back from the budget so a release (or read-back) still fits after a slow Binding.
    return min(1.0, deps.budget / 4)


def unreadable(message: str, deps: Deps) -> BindOutcome:
    """The reply to a body that is not JSON at all (bind still answers 200 with ``Error``)."""
    deps.metrics.verb_done("bind", "malformed", 0.0)
    return _failed("malformed", message, "")


async def _bind(raw: object, deps: Deps) -> BindOutcome:
    try:
        args = ExtenderBindingArgs.from_dict(raw)
    except ContractError as exc:
        return _failed("malformed", f"invalid ExtenderBindingArgs: {exc}", "")
    label = f"{args.pod_namespace}/{args.pod_name}"
    with anyio.move_on_after(deps.budget - _cleanup_seconds(deps)) as scope:
        outcome = await _commit_and_bind(args, deps, label)
    if scope.cancelled_caught:
        outcome = await _after_timeout(args, deps, label)
    return outcome


async def _commit_and_bind(args: ExtenderBindingArgs, deps: Deps, label: str) -> BindOutcome:
    try:
        allocation = _checked(await deps.allocator.commit(args.pod_uid, args.node), args)
    except ClaimNotHeld as exc:
        if exc.absent and await _asks_nothing(args, deps):
            return await _bind_plain(args, deps, label)
        # Not our claim to release: another pod (or nobody) holds it.
        return _told(deps, args, _failed("claim_not_held", exc.message, label))
    except (AllocatorUnavailable, PeerReplyInvalid) as exc:
        return await _release_after(args, deps, _failed("commit_failed", exc.message, label))
    annotations = dict(allocation.annotations)
    try:
        await deps.apiserver.bind(
            args.pod_namespace,
            args.pod_name,
            uid=args.pod_uid,
            node=args.node,
            annotations=annotations,
        )
    except KubeError as exc:
        return await _binding_failed(args, deps, exc, label)
    return _bound(deps, args, allocation, label)


async def _asks_nothing(args: ExtenderBindingArgs, deps: Deps) -> bool:
    """Whether the pod asks for no cards (kube-scheduler delegates every bind to the binder
    extender when ``managedResources`` is empty, GPU pods or not)."""
    resources = deps.settings.resources
    try:
        pod = await deps.apiserver.read_pod(
            args.pod_namespace, args.pod_name, timeout=_cleanup_seconds(deps)
        )
        demand = read_demand(pod, count_resource=resources.count, memory_resource=resources.memory)
    except (KubeError, PodNotServable, InvalidQuantity):
        return False
    return not demand.asks


async def _bind_plain(args: ExtenderBindingArgs, deps: Deps, label: str) -> BindOutcome:
    try:
        await deps.apiserver.bind(
            args.pod_namespace, args.pod_name, uid=args.pod_uid, node=args.node, annotations={}
        )
    except KubeError as exc:
        if isinstance(exc, KubeConflict) and bound_node(exc.kube_message) == args.node:
            return _already(label)
        return _failed("bind_failed", f"binding pod {label} to {args.node}: {exc.message}", label)
    return BindOutcome(result=ExtenderBindingResult(), outcome="bound_without_gpu", pod=label)


def _checked(allocation: Allocation, args: ExtenderBindingArgs) -> Allocation:
    if allocation.pod.uid != args.pod_uid:
        raise ClaimNotHeld(
            f"the allocator committed a claim of pod uid {allocation.pod.uid}, not "
            f"{args.pod_uid}; refusing to bind {args.pod_namespace}/{args.pod_name}"
        )
    if ANNOTATION_ENDPOINT not in dict(allocation.annotations):
        raise PeerReplyInvalid(
            f"the allocator's commit for pod uid {args.pod_uid} carries no {ANNOTATION_ENDPOINT} "
            "annotation; the pod could not reach its GPU server, so it is not bound"
        )
    return allocation


async def _binding_failed(
    args: ExtenderBindingArgs, deps: Deps, exc: KubeError, label: str
) -> BindOutcome:
    if isinstance(exc, KubeConflict) and bound_node(exc.kube_message) == args.node:
        return _already(label)
    failed = _failed("bind_failed", f"binding pod {label} to {args.node}: {exc.message}", label)
    if isinstance(exc, KubeUnavailable):
        return await _verify(args, deps, failed)
    return await _release_after(args, deps, failed)


async def _after_timeout(args: ExtenderBindingArgs, deps: Deps, label: str) -> BindOutcome:
    message = (
        f"binding pod {label} to {args.node} did not finish within the "
        f"{deps.budget:g}s budget (RGPU_EXTENDER_BUDGET_SECONDS)"
    )
    return await _verify(args, deps, _failed("timeout", message, label))


async def _verify(args: ExtenderBindingArgs, deps: Deps, failed: BindOutcome) -> BindOutcome:
    """Settle a Binding whose outcome is unknown by reading the pod back."""
    node: str | None = None
    with anyio.move_on_after(_cleanup_seconds(deps)):
        try:
            pod = await deps.apiserver.read_pod(
                args.pod_namespace, args.pod_name, timeout=_cleanup_seconds(deps)
            )
            node = str(mapping(pod.get("spec")).get("nodeName") or "")
        except KubeError as exc:
            logger.info("cannot read back pod %s after a failed bind: %s", failed.pod, exc)
    if node == args.node:
        return _already(failed.pod)
    if node is None:
        # Unknown either way: keep the claim. If the pod was not bound, its booking lapses
        # after RGPU_BOOKING_TTL_SECONDS; releasing now could free a server a bound pod uses.
        message = f"{failed.result.error}; the pod's claim is kept until its booking expires"
        return _told(deps, args, _failed(failed.outcome, message, failed.pod))
    return await _release_after(args, deps, failed)


async def _release_after(args: ExtenderBindingArgs, deps: Deps, failed: BindOutcome) -> BindOutcome:
    message = failed.result.error
    with anyio.move_on_after(_cleanup_seconds(deps)) as scope:
        try:
            await deps.allocator.release(args.pod_uid)
        except (AllocatorUnavailable, PeerReplyInvalid) as exc:
            message = f"{message}; releasing its claim failed too ({exc.message})"
    if scope.cancelled_caught:
        message = f"{message}; releasing its claim timed out (it lapses with its booking)"
    return _told(deps, args, _failed(failed.outcome, message, failed.pod))


def _failed(outcome: str, message: str, label: str) -> BindOutcome:
    return BindOutcome(result=ExtenderBindingResult(error=message), outcome=outcome, pod=label)


def _ref(args: ExtenderBindingArgs) -> PodRef:
    return PodRef(uid=PodUID(args.pod_uid), namespace=args.pod_namespace, name=args.pod_name)


def _told(deps: Deps, args: ExtenderBindingArgs, outcome: BindOutcome) -> BindOutcome:
    event = pod_event(
        pod=_ref(args), reason=BIND_FAILED, message=outcome.result.error, warning=True
    )
    deps.events.record(event)
    return outcome


def _already(label: str) -> BindOutcome:
    return BindOutcome(result=ExtenderBindingResult(), outcome="already_bound", pod=label)


def _bound(
    deps: Deps, args: ExtenderBindingArgs, allocation: Allocation, label: str
) -> BindOutcome:
    cards = ", ".join(allocation.cards) or "none"
    message = (
        f"remote GPU server {allocation.server} at {allocation.endpoint} with cards {cards}, "
        f"pod bound to {args.node}"
    )
    deps.events.record(pod_event(pod=_ref(args), reason=ALLOCATED, message=message))
    return BindOutcome(result=ExtenderBindingResult(), outcome="bound", pod=label)
