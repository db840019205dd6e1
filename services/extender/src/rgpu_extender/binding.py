"""Bind turns a booked claim into a placed pod, and its two writes (the
allocator's commit, the apiserver's Binding) must leave no half-state behind: a pod bound
without its endpoint annotation cannot reach its GPU, and a claim released for a pod that did
get bound hands its server to a second pod.

So the committed annotations ride on the Binding itself (the apiserver merges them into the pod
in the same update as ``nodeName``), and the claim is released at once only when the Binding
was definitely refused (a 4xx answer, the pod gone or replaced). Unknown is not failure: a
Binding with no answer, a 5xx or a timeout may still be applied, so its claim is kept and the
allocator's own rules settle it (valid while the pod is bound, lapsed once the booking TTL
passes with the pod unbound); reading the pod back only turns an unknown into a success.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import anyio

from rgpu_contracts import (
    ANNOTATION_BOOKING,
    ANNOTATION_ENDPOINT,
    Allocation,
    ContractError,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    PodRef,
    PodUID,
)
from rgpu_placement import InvalidQuantity, read_demand
from rgpu_runtime.errors import KubeConflict, KubeError, KubeNotFound
from rgpu_runtime.kube import EventRecorder
from rgpu_runtime.settings import ResourceSettings

from .clients import AllocatorClient, Apiserver
from .errors import AllocatorUnavailable, ClaimNotHeld, PeerReplyInvalid, PodNotServable
from .events import ALLOCATED, BIND_FAILED, pod_event
from .instruments import ExtenderMetrics, observed
from .objects import mapping

__all__ = ["BindOutcome", "Binding", "bound_node"]

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    """The ``/bind`` verb with the two services it writes to; built once by the lifespan."""

    allocator: AllocatorClient
    apiserver: Apiserver
    events: EventRecorder
    metrics: ExtenderMetrics
    resources: ResourceSettings
    budget: float
    """Seconds the whole bind may take (``RGPU_EXTENDER_BUDGET_SECONDS``)."""
    keep_refused: bool = False
    """Keep the booking of a pod whose Binding was refused and that is still unbound
    (``RGPU_ADMISSION=gate``) when admission made it (the pod carries ``rgpu.io/booking``): it
    was booked in its queue's order and within its namespace's quota and its gang, and the
    retry binds on it. Releasing it would send the retry through kube-scheduler's filter,
    which books past quotas, gangs and fair share. A booking the filter made, and every one
    in HAMi's flow, is released at once, so another pod may take the server."""

    @property
    def cleanup_seconds(self) -> float:
        """Kept back from the budget so a release (or read-back) still fits after a slow
        Binding."""
        return min(1.0, self.budget / 4)

    async def bind_pod(self, raw: object) -> BindOutcome:
        """Decide ``/bind`` for the ExtenderBindingArgs ``raw``; never raises for bad input."""
        return await observed("bind", self.metrics, self._bind(raw), time.perf_counter())

    def unreadable(self, message: str) -> BindOutcome:
        """The reply to a body that is not JSON at all (bind still answers 200 with ``Error``)."""
        self.metrics.verb_done("bind", "malformed", 0.0)
        return _failed("malformed", message, "")

    async def _bind(self, raw: object) -> BindOutcome:
        try:
            args = ExtenderBindingArgs.from_dict(raw)
        except ContractError as exc:
            return _failed("malformed", f"invalid ExtenderBindingArgs: {exc}", "")
        label = f"{args.pod_namespace}/{args.pod_name}"
        with anyio.move_on_after(self.budget - self.cleanup_seconds) as scope:
            outcome = await self._commit_and_bind(args, label)
        if scope.cancelled_caught:
            outcome = await self._after_timeout(args, label)
        return outcome

    async def _commit_and_bind(self, args: ExtenderBindingArgs, label: str) -> BindOutcome:
        try:
            allocation = _checked(await self.allocator.commit(args.pod_uid, args.node), args)
        except ClaimNotHeld as exc:
            if exc.absent and await self._asks_nothing(args):
                return await self._bind_plain(args, label)
            # Not our claim to release: another pod (or nobody) holds it.
            return self._told(args, _failed("claim_not_held", exc.message, label))
        except AllocatorUnavailable as exc:
            # The commit may have landed; no Binding was sent, so the pod's retry finds the
            # same claim, and an earlier attempt's late Binding still has its server.
            return self._kept(args, _failed("commit_failed", exc.message, label))
        except PeerReplyInvalid as exc:
            return await self._release_after(args, _failed("commit_failed", exc.message, label))
        try:
            await self._post_binding(args, dict(allocation.annotations))
        except KubeError as exc:
            return await self._binding_failed(args, exc, label)
        return self._bound(args, allocation, label)

    async def _post_binding(self, args: ExtenderBindingArgs, annotations: dict[str, str]) -> None:
        await self.apiserver.bind(
            args.pod_namespace,
            args.pod_name,
            uid=args.pod_uid,
            node=args.node,
            annotations=annotations,
        )

    async def _asks_nothing(self, args: ExtenderBindingArgs) -> bool:
        """Whether the pod asks for no cards (kube-scheduler delegates every bind to the binder
        extender when ``managedResources`` is empty, GPU pods or not)."""
        count, memory = self.resources.count, self.resources.memory
        try:
            pod = await self._read_pod(args)
            demand = read_demand(pod, count_resource=count, memory_resource=memory)
        except (KubeError, PodNotServable, InvalidQuantity):
            return False
        return not demand.asks

    async def _read_pod(self, args: ExtenderBindingArgs) -> dict[str, Any]:
        return await self.apiserver.read_pod(
            args.pod_namespace, args.pod_name, timeout=self.cleanup_seconds
        )

    async def _bind_plain(self, args: ExtenderBindingArgs, label: str) -> BindOutcome:
        try:
            await self._post_binding(args, {})
        except KubeError as exc:
            if _already_there(exc, args):
                return _already(label)
            message = f"binding pod {label} to {args.node}: {exc.message}"
            return _failed("bind_failed", message, label)
        return BindOutcome(result=ExtenderBindingResult(), outcome="bound_without_gpu", pod=label)

    async def _binding_failed(
        self, args: ExtenderBindingArgs, exc: KubeError, label: str
    ) -> BindOutcome:
        if _already_there(exc, args):
            return _already(label)
        message = f"binding pod {label} to {args.node}: {exc.message}"
        # Even a definite refusal is settled on the pod read back: a pod being deleted is
        # refused before its node is looked at, and may be running elsewhere on this claim.
        refused = _refused(exc)
        outcome = "bind_failed" if refused else "bind_unknown"
        return await self._verify(args, _failed(outcome, message, label), refused=refused)

    async def _after_timeout(self, args: ExtenderBindingArgs, label: str) -> BindOutcome:
        message = (
            f"binding pod {label} to {args.node} did not finish within the "
            f"{self.budget:g}s budget (RGPU_EXTENDER_BUDGET_SECONDS)"
        )
        return await self._verify(args, _failed("timeout", message, label))

    async def _verify(
        self, args: ExtenderBindingArgs, failed: BindOutcome, *, refused: bool = False
    ) -> BindOutcome:
        """Settle a Binding that did not succeed by reading the pod back: bound to our node is
        success; gone, replaced, or bound elsewhere without rgpu's annotations frees the claim,
        and so does a pod still unbound after a definite refusal (``refused``) unless
        ``keep_refused``; anything else (unbound after an unknown outcome, bound elsewhere by an
        earlier attempt, unreadable) keeps it."""
        seen = await self._read_back(args, failed.pod)
        if seen is not None and seen.node == args.node and not seen.gone:
            return _already(failed.pod)
        if seen is not None and seen.frees_claim:
            return await self._release_after(args, failed)
        if seen is not None and refused and not seen.node:
            if self.keep_refused and seen.admitted:
                return self._kept(args, failed, why="the retry binds on the booking admission made")
            return await self._release_after(args, failed)
        return self._kept(args, failed)

    async def _read_back(self, args: ExtenderBindingArgs, label: str) -> _Seen | None:
        """The pod as read back now, ``None`` when the read gave no definite answer."""
        with anyio.move_on_after(self.cleanup_seconds):
            try:
                pod = await self._read_pod(args)
            except KubeNotFound:
                return _Seen(gone=True)
            except KubeError as exc:
                logger.info("cannot read back pod %s after a failed bind: %s", label, exc)
            else:
                return _Seen.of(pod, args.pod_uid)
        return None

    def _kept(
        self,
        args: ExtenderBindingArgs,
        failed: BindOutcome,
        *,
        why: str = "the pod may be bound yet",
    ) -> BindOutcome:
        message = (
            f"{failed.result.error}; the pod's claim is kept ({why}): it holds while the pod "
            "is bound and lapses with its booking if the pod stays unbound"
        )
        return self._told(args, _failed(failed.outcome, message, failed.pod))

    async def _release_after(self, args: ExtenderBindingArgs, failed: BindOutcome) -> BindOutcome:
        message = failed.result.error
        with anyio.move_on_after(self.cleanup_seconds) as scope:
            try:
                await self.allocator.release(args.pod_uid)
            except (AllocatorUnavailable, PeerReplyInvalid) as exc:
                message = f"{message}; releasing its claim failed too ({exc.message})"
        if scope.cancelled_caught:
            message = f"{message}; releasing its claim timed out (it lapses with its booking)"
        return self._told(args, _failed(failed.outcome, message, failed.pod))

    def _told(self, args: ExtenderBindingArgs, outcome: BindOutcome) -> BindOutcome:
        message = outcome.result.error
        event = pod_event(pod=_ref(args), reason=BIND_FAILED, message=message, warning=True)
        self.events.record(event)
        return outcome

    def _bound(self, args: ExtenderBindingArgs, allocation: Allocation, label: str) -> BindOutcome:
        cards = ", ".join(allocation.cards) or "none"
        message = (
            f"remote GPU server {allocation.server} at {allocation.endpoint} with cards {cards}, "
            f"pod bound to {args.node}"
        )
        self.events.record(pod_event(pod=_ref(args), reason=ALLOCATED, message=message))
        return BindOutcome(result=ExtenderBindingResult(), outcome="bound", pod=label)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Seen:
    """A pod as read back after a Binding that did not succeed."""

    node: str = ""
    """Its ``spec.nodeName``; empty while unbound."""
    gone: bool = False
    """The pod no longer exists, or another pod of the same name replaced it."""
    ours: bool = False
    """It carries rgpu's endpoint annotation, which only a Binding after a commit sets (the
    webhook refuses it from anyone else): an earlier attempt of this pod bound it."""
    admitted: bool = False
    """It carries the booking rgpu's admission made when it lifted the gate (only rgpu may set
    the annotation): a booking that kube-scheduler's filter made instead is released on a
    refusal, as in HAMi's flow."""

    @classmethod
    def of(cls, pod: dict[str, Any], uid: str) -> _Seen:
        meta, spec = mapping(pod.get("metadata")), mapping(pod.get("spec"))
        return cls(
            node=str(spec.get("nodeName") or ""),
            gone=str(meta.get("uid") or "") != uid,
            ours=ANNOTATION_ENDPOINT in mapping(meta.get("annotations")),
            admitted=ANNOTATION_BOOKING in mapping(meta.get("annotations")),
        )

    @property
    def frees_claim(self) -> bool:
        """Whether the claim is certainly of no use to the pod: it is gone, or it runs on a
        node someone else bound it to, without rgpu's server."""
        return self.gone or (bool(self.node) and not self.ours)


def _refused(exc: KubeError) -> bool:
    """Whether the apiserver answered the Binding with a definite refusal (any 4xx: 400/422
    invalid, 401/403, 404 gone, 409, 429 shed before it ran); no answer, a 5xx or an answer
    we could not read leave it unknown, since it may have been applied."""
    return 400 <= exc.kube_status < 500


def _already_there(exc: KubeError, args: ExtenderBindingArgs) -> bool:
    """Whether ``exc`` says the pod is already bound, to the very node asked for."""
    return isinstance(exc, KubeConflict) and bound_node(exc.kube_message) == args.node


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


def _failed(outcome: str, message: str, label: str) -> BindOutcome:
    return BindOutcome(result=ExtenderBindingResult(error=message), outcome=outcome, pod=label)


def _ref(args: ExtenderBindingArgs) -> PodRef:
    return PodRef(uid=PodUID(args.pod_uid), namespace=args.pod_namespace, name=args.pod_name)


def _already(label: str) -> BindOutcome:
    return BindOutcome(result=ExtenderBindingResult(), outcome="already_bound", pod=label)
