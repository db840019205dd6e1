"""The webhook's decision for one AdmissionReview — mutate a new GPU
pod, guard the scheduler-owned annotations on updates, allow everything else — kept apart from
HTTP so every rule is a plain function call in tests.

The annotations bind writes are the pod's claim on a GPU server; a user who could edit them
could point a pod at a server someone else holds, so on UPDATE only rgpu itself (its service
accounts in ``RGPU_NAMESPACE``) and ``RGPU_TRUSTED_USERS`` may touch them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from rgpu_contracts import AdmissionRequest, ContractError, admission_allow, admission_deny
from rgpu_runtime import Settings

from .errors import AdmissionDenied, MalformedReview
from .metrics import ExtenderMetrics
from .mutation import MutationPolicy, is_owned, mutate_pod
from .patching import Op
from .pods import mapping, pod_label

__all__ = ["AdmissionPolicy", "Decision", "admit", "decide"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionPolicy:
    """What the webhook decides with: the mutation policy and who may edit owned annotations."""

    mutation: MutationPolicy
    trusted_users: frozenset[str]
    namespace: str

    @classmethod
    def from_settings(cls, settings: Settings) -> AdmissionPolicy:
        return cls(
            mutation=MutationPolicy.from_settings(settings),
            trusted_users=frozenset(settings.scheduling.trusted_users),
            namespace=settings.scheduling.namespace,
        )

    def trusts(self, username: str) -> bool:
        """rgpu's own service accounts and the configured users may edit owned annotations."""
        own = f"system:serviceaccount:{self.namespace}:"
        return username in self.trusted_users or username.startswith(own)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The AdmissionReview to answer with, and how it went (for spans, metrics, logs)."""

    review: dict[str, object]
    operation: str
    allowed: bool
    outcome: str
    """``mutated``, ``unchanged``, ``denied`` or ``ignored`` (not a pod / not our operation)."""
    message: str = ""
    pod: str = ""


def admit(raw: object, policy: AdmissionPolicy, metrics: ExtenderMetrics) -> Decision:
    """``decide`` within a span, counted and timed; raises ``MalformedReview`` as it does."""
    started = time.perf_counter()
    with tracer.start_as_current_span("extender.mutate") as span:
        try:
            decision = decide(raw, policy)
        except MalformedReview:
            metrics.webhook.labels("unknown", "malformed").inc()
            raise
        span.set_attribute("k8s.pod", decision.pod)
        span.set_attribute("rgpu.operation", decision.operation)
        span.set_attribute("rgpu.outcome", decision.outcome)
    metrics.webhook.labels(decision.operation, decision.outcome).inc()
    metrics.verb_seconds.labels("mutate", decision.outcome).observe(time.perf_counter() - started)
    if not decision.allowed:
        logger.info("denied %s of pod %s: %s", decision.operation, decision.pod, decision.message)
    return decision


def decide(raw: object, policy: AdmissionPolicy) -> Decision:
    """Decide one AdmissionReview; raises ``MalformedReview`` when there is no uid to echo."""
    try:
        request = AdmissionRequest.from_review(raw)
    except ContractError as exc:
        raise MalformedReview(f"not an admission.k8s.io/v1 AdmissionReview: {exc}") from exc
    if request.resource != "pods" or request.sub_resource:
        return _allowed(request, (), "ignored")
    try:
        return _decide_pod(request, policy)
    except AdmissionDenied as exc:
        pod = _label(request)
        review = admission_deny(request.uid, exc.message, exc.status_code)
        return Decision(
            review=review,
            operation=request.operation,
            allowed=False,
            outcome="denied",
            message=exc.message,
            pod=pod,
        )


def _decide_pod(request: AdmissionRequest, policy: AdmissionPolicy) -> Decision:
    if request.operation == "CREATE":
        patch = mutate_pod(_object(request), policy.mutation)
        return _allowed(request, patch, "mutated" if patch else "unchanged")
    if request.operation == "UPDATE":
        _guard_update(request, policy)
        return _allowed(request, (), "unchanged")
    return _allowed(request, (), "ignored")


def _label(request: AdmissionRequest) -> str:
    return pod_label(request.object or request.old_object or {}, request.namespace)


def _object(request: AdmissionRequest) -> Mapping[str, Any]:
    if request.object is None:
        raise AdmissionDenied(
            f"{request.operation} review {request.uid} carries no object to check; this is an "
            "apiserver or webhook configuration fault"
        )
    return request.object


def _annotations(pod: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return mapping(mapping(mapping(pod).get("metadata")).get("annotations"))


def _guard_update(request: AdmissionRequest, policy: AdmissionPolicy) -> None:
    new, old = _annotations(_object(request)), _annotations(request.old_object)
    changed = sorted(k for k in {*new, *old} if is_owned(k) and new.get(k) != old.get(k))
    if changed and not policy.trusts(request.user.username):
        raise AdmissionDenied(
            f"user {request.user.username!r} may not add, change or remove annotation(s) "
            f"{', '.join(changed)} on pod {_label(request)}: the scheduler writes "
            "them when it allocates a remote GPU; leave them as they are (operators: add the "
            "user to RGPU_TRUSTED_USERS)"
        )


def _allowed(request: AdmissionRequest, patch: tuple[Op, ...], outcome: str) -> Decision:
    pod = _label(request)
    review = admission_allow(request.uid, patch)
    return Decision(
        review=review, operation=request.operation, allowed=True, outcome=outcome, pod=pod
    )
