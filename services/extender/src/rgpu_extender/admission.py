"""The webhook's decision for one AdmissionReview — mutate a new GPU pod, guard the
scheduler-owned annotations on updates, allow everything else — kept apart from HTTP so every
rule is a plain function call in tests.

A GPU pod is only schedulable and runnable by rgpu once it names our scheduler, reads its endpoint
through the downward API, keeps off lupine server nodes (``affinity``) and, when memory is capped,
preloads HAMi-core (``container_env`` says what each container gets); the webhook adds all of that
at CREATE, refusing what would defeat it. The result is idempotent: mutating an already-mutated pod
yields no operations, so the webhook is safe under ``reinvocationPolicy: IfNeeded`` and under
apiserver retries.

At CREATE of a GPU pod the webhook also records its own span's context in the pod
(``rgpu.io/trace``), the start of the pod's scheduling story that later steps link to. That
one scheduler-owned annotation may be present at CREATE (the webhook's own, when it is
reinvoked) and is kept when it holds a readable context: it only ever becomes a span link.

The answer is an RFC 6902 JSONPatch built with ``patchops``, whose helpers create missing
parents and escape keys as the apiserver needs.

The annotations bind writes are the pod's claim on a GPU server; a user who could set them
could point a pod at a server someone else holds, or have the allocator's repair book a server
for a pod that never asked for one. So on CREATE and UPDATE of *every* pod (GPU or not, and on
the subresources that carry a whole pod: status, ephemeralcontainers, resize) only the exact
identities in ``RGPU_TRUSTED_USERS`` may set, change or remove them: no prefix or namespace is
trusted, since any workload in rgpu's namespace would otherwise inherit the right. The old and
new annotation maps are compared as decoded objects, so however a patch spelled the key
(``hami.io~1lupine-endpoint`` in a JSON patch) the change is seen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from rgpu_contracts import (
    ANNOTATION_ENDPOINT,
    AdmissionRequest,
    ContractError,
    admission_allow,
    admission_deny,
    pointer,
)
from rgpu_placement import ContainerDemand, InvalidQuantity, PodDemand, lookalikes, read_demand
from rgpu_runtime.telemetry import TRACE_ANNOTATION, creation_context, traceparent_of

from .affinity import affinity_ops
from .container_env import (
    COPY_CONTAINER,
    LIB_VOLUME,
    copy_container,
    env_list,
    lib_env,
    lib_mount,
    lib_volume,
    set_env,
    wired_env,
)
from .endpoints import refuse_stray_endpoints
from .errors import AdmissionDenied, MalformedPod, MalformedReview
from .gating import gate_ops, guard_gate
from .instruments import ExtenderMetrics, label_attributes
from .objects import mapping, pod_label
from .patchops import Op, append_item, insert_first, put, put_member
from .reviewshape import too_many_containers
from .settings import ExtenderSettings
from .shapes import check_pod

__all__ = [
    "DEFAULT_SCHEDULER",
    "MARKER_ANNOTATION",
    "AdmissionPolicy",
    "Decision",
    "MutationPolicy",
    "Op",
    "admit",
    "decide",
    "is_owned",
    "mutate_pod",
]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

DEFAULT_SCHEDULER = "default-scheduler"
MARKER_ANNOTATION = "hami.io/webhook-mutated"
_OWNED_PREFIXES = ("hami.io/remote-gpu-devices-", "rgpu.io/")
_POD_SUBRESOURCES = ("", "status", "ephemeralcontainers", "resize")
"""Pod subresources whose review carries the whole pod, annotations included."""


def is_owned(key: str) -> bool:
    """Whether an annotation is written only by the scheduler side (bind, allocator)."""
    return key == ANNOTATION_ENDPOINT or key.startswith(_OWNED_PREFIXES)


@dataclass(frozen=True, slots=True, kw_only=True)
class MutationPolicy:
    """The settings the webhook's CREATE mutation depends on."""

    count_resource: str
    memory_resource: str
    scheduler_name: str
    card_mode: bool
    lib_image: str | None
    gate: bool = False
    """Whether new GPU pods wait behind rgpu's scheduling gate (``RGPU_ADMISSION=gate``)."""

    @classmethod
    def from_settings(cls, settings: ExtenderSettings) -> MutationPolicy:
        return cls(
            count_resource=settings.resources.count,
            memory_resource=settings.resources.memory,
            scheduler_name=settings.scheduling.scheduler_name,
            card_mode=settings.scheduling.granularity == "card",
            lib_image=settings.scheduling.lib_image,
            gate=settings.admission.mode == "gate",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionPolicy:
    """What the webhook decides with: the mutation policy and who may edit owned annotations."""

    mutation: MutationPolicy
    trusted_users: frozenset[str]

    @classmethod
    def from_settings(cls, settings: ExtenderSettings) -> AdmissionPolicy:
        return cls(
            mutation=MutationPolicy.from_settings(settings),
            trusted_users=frozenset(settings.scheduling.trusted_users),
        )

    def trusts(self, username: str) -> bool:
        """Only the exact users of ``RGPU_TRUSTED_USERS`` may edit owned annotations."""
        return username in self.trusted_users


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
            decision = decide(raw, policy, traceparent=traceparent_of(span))
        except MalformedReview:
            metrics.webhook.labels("unknown", "malformed").inc()
            raise
        span.set_attributes(label_attributes(decision.pod))
        span.set_attribute("rgpu.operation", decision.operation)
        span.set_attribute("rgpu.outcome", decision.outcome)
    metrics.webhook.labels(decision.operation, decision.outcome).inc()
    metrics.verb_seconds.labels("mutate", decision.outcome).observe(time.perf_counter() - started)
    if not decision.allowed:
        logger.info("denied %s of pod %s: %s", decision.operation, decision.pod, decision.message)
    return decision


def decide(raw: object, policy: AdmissionPolicy, *, traceparent: str | None = None) -> Decision:
    """Decide one AdmissionReview; raises ``MalformedReview`` when there is no uid to echo.

    ``traceparent`` is the webhook's span, recorded on a GPU pod it creates.
    """
    try:
        request = AdmissionRequest.from_review(raw)
    except ContractError as exc:
        raise MalformedReview(f"not an admission.k8s.io/v1 AdmissionReview: {exc}") from exc
    if request.resource != "pods" or request.sub_resource not in _POD_SUBRESOURCES:
        return _allowed(request, (), "ignored")
    try:
        return _decide_pod(request, policy, traceparent)
    except (AdmissionDenied, MalformedPod) as exc:
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


def _decide_pod(
    request: AdmissionRequest, policy: AdmissionPolicy, traceparent: str | None
) -> Decision:
    if request.operation not in ("CREATE", "UPDATE"):
        return _allowed(request, (), "ignored")
    _refuse_crowds(request)
    check_pod(request.object)
    check_pod(request.old_object)
    _guard_owned(request, policy)
    if request.operation == "UPDATE":
        trusted = policy.trusts(request.user.username)
        guard_gate(
            request.old_object, _object(request), username=request.user.username, trusted=trusted
        )
    _refuse_ephemeral_asks(_object(request), policy.mutation)
    if request.sub_resource == "ephemeralcontainers":
        # The containers added here were never seen at CREATE.
        resource = policy.mutation.count_resource
        refuse_stray_endpoints(
            _object(request), None, resource=resource, sections=("ephemeralContainers",)
        )
    if request.operation == "CREATE" and not request.sub_resource:
        pod = _object(request)
        patch = mutate_pod(pod, policy.mutation, traceparent=traceparent)
        warnings = _lookalike_warnings(pod, policy.mutation)
        return _allowed(request, patch, "mutated" if patch else "unchanged", warnings)
    return _allowed(request, (), "unchanged")


def _refuse_crowds(request: AdmissionRequest) -> None:
    """Containers are counted before any of them is read."""
    for pod, where in ((request.object, "object"), (request.old_object, "oldObject")):
        refusal = too_many_containers(pod)
        if refusal is not None:
            raise MalformedPod(f"request.{where}.spec", refusal)


def _lookalike_warnings(pod: Mapping[str, Any], policy: MutationPolicy) -> tuple[str, ...]:
    """A pod asking for ``nvidia.com/remote-gpus`` waits forever: say so as it is created."""
    found = lookalikes(
        pod, count_resource=policy.count_resource, memory_resource=policy.memory_resource
    )
    return tuple(f"pod {pod_label(pod)}: {lookalike.message}" for lookalike in found)


def _label(request: AdmissionRequest) -> str:
    return pod_label(request.object or request.old_object or {}, request.namespace)


def _object(request: AdmissionRequest) -> Mapping[str, Any]:
    if request.object is None:
        raise AdmissionDenied(
            f"{request.operation} review {request.uid} carries no object to check; this is an "
            "apiserver or webhook configuration fault"
        )
    return request.object


def _guard_owned(request: AdmissionRequest, policy: AdmissionPolicy) -> None:
    new = mapping(_annotations(_object(request)))
    creating = request.operation == "CREATE"
    old = {} if creating else mapping(_annotations(request.old_object))
    changed = sorted(
        k
        for k in {*new, *old}
        if is_owned(k) and new.get(k) != old.get(k) and not (creating and k == TRACE_ANNOTATION)
    )
    if changed and not policy.trusts(request.user.username):
        verb = "set" if creating else "add, change or remove"
        fix = "remove them from metadata.annotations" if creating else "leave them as they are"
        raise AdmissionDenied(
            f"user {request.user.username!r} may not {verb} annotation(s) "
            f"{', '.join(changed)} on pod {_label(request)}: the scheduler writes them when it "
            f"allocates a remote GPU; {fix} (operators: only rgpu's own service accounts "
            "belong in RGPU_TRUSTED_USERS)"
        )


def _refuse_ephemeral_asks(pod: Mapping[str, Any], policy: MutationPolicy) -> None:
    """Ephemeral containers get no resources in Kubernetes, so never a remote GPU either."""
    ephemeral = mapping(pod.get("spec")).get("ephemeralContainers") or ()
    wanted = (policy.count_resource, policy.memory_resource)
    for index, container in enumerate(ephemeral):
        resources = mapping(container.get("resources"))
        asked = [
            r
            for part in ("limits", "requests")
            for r in wanted
            if r in mapping(resources.get(part))
        ]
        if asked:
            raise AdmissionDenied(
                f"pod {pod_label(pod)}: spec.ephemeralContainers[{index}] asks for "
                f"{', '.join(sorted(set(asked)))}; ephemeral containers cannot hold remote GPUs: "
                "remove those resources from the ephemeral container"
            )


def _allowed(
    request: AdmissionRequest, patch: tuple[Op, ...], outcome: str, warnings: tuple[str, ...] = ()
) -> Decision:
    pod = _label(request)
    review = admission_allow(request.uid, patch, warnings)
    return Decision(
        review=review, operation=request.operation, allowed=True, outcome=outcome, pod=pod
    )


def mutate_pod(
    pod: Mapping[str, Any], policy: MutationPolicy, *, traceparent: str | None = None
) -> tuple[Op, ...]:
    """The JSONPatch a new pod needs; ``()`` for a pod that asks for no cards.

    ``traceparent`` is recorded as the pod's creation unless it carries a readable one.
    Raises ``AdmissionDenied`` with a message the pod's author can act on (a container that
    asks for nothing but names a lupine server is refused in every pod: ``endpoints``).
    """
    demand = _demand(pod, policy)
    refuse_stray_endpoints(pod, demand, resource=policy.count_resource)
    if not demand.asks:
        return ()
    _refuse_owned_annotations(pod, policy)
    _refuse_node_name(pod)
    # Container edits use the original indices, so they go before the copy container is
    # inserted at the front of initContainers.
    return (
        *_container_ops(demand, policy),
        *_pod_lib_ops(pod, demand, policy),
        *_scheduler_ops(pod, policy),
        *affinity_ops(pod),
        *(gate_ops(pod) if policy.gate else ()),
        *_annotation_ops(pod, traceparent),
    )


def _demand(pod: Mapping[str, Any], policy: MutationPolicy) -> PodDemand:
    try:
        return read_demand(
            pod, count_resource=policy.count_resource, memory_resource=policy.memory_resource
        )
    except InvalidQuantity as exc:
        raise AdmissionDenied(f"pod {pod_label(pod)}: {exc}") from exc


def _annotations(pod: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The pod's annotations; ``None`` when absent (a patch must then create the member)."""
    value = mapping(mapping(pod).get("metadata")).get("annotations")
    return value if isinstance(value, Mapping) else None


def _refuse_owned_annotations(pod: Mapping[str, Any], policy: MutationPolicy) -> None:
    owned = sorted(
        key for key in _annotations(pod) or {} if is_owned(key) and key != TRACE_ANNOTATION
    )
    if owned:
        raise AdmissionDenied(
            f"pod {pod_label(pod)} sets annotation(s) {', '.join(owned)}, which "
            f"{policy.scheduler_name} writes when it binds the pod to a GPU server; remove them "
            "from the pod's metadata.annotations"
        )


def _refuse_node_name(pod: Mapping[str, Any]) -> None:
    node = mapping(pod.get("spec")).get("nodeName")
    if node:
        raise AdmissionDenied(
            f"pod {pod_label(pod)} sets spec.nodeName={node!r}, which skips the scheduler and "
            "so the remote-GPU allocation; remove spec.nodeName and use a nodeSelector or node "
            "affinity to choose nodes"
        )


def _needs_lib(container: ContainerDemand, policy: MutationPolicy) -> bool:
    return policy.lib_image is not None and container.memory_mib > 0


def _container_ops(demand: PodDemand, policy: MutationPolicy) -> Iterator[Op]:
    for container in demand.requesting:
        body = container.slot.body
        base = ["spec", container.slot.section, container.slot.index]
        env = env_list(body)
        new_env = set_env(env, wired_env(card_mode=policy.card_mode))
        if _needs_lib(container, policy):
            new_env = lib_env(
                new_env, memory_mib=container.memory_mib, container=container.slot.name
            )
            yield from _mount_ops(base, body)
        if new_env != env:
            yield put([*base, "env"], new_env, exists="env" in body)


def _names(items: object) -> set[str]:
    return {str(mapping(i).get("name")) for i in items} if isinstance(items, list) else set()


def _list_or_none(value: object) -> list[Any] | None:
    return value if isinstance(value, list) else None


def _mount_ops(base: list[str | int], body: Mapping[str, Any]) -> Iterator[Op]:
    mounts = body.get("volumeMounts")
    if LIB_VOLUME not in _names(mounts):
        yield append_item([*base, "volumeMounts"], _list_or_none(mounts), lib_mount())


def _pod_lib_ops(pod: Mapping[str, Any], demand: PodDemand, policy: MutationPolicy) -> Iterator[Op]:
    if policy.lib_image is None or not any(_needs_lib(c, policy) for c in demand.requesting):
        return
    spec = mapping(pod.get("spec"))
    volumes, inits = spec.get("volumes"), spec.get("initContainers")
    if LIB_VOLUME not in _names(volumes):
        yield append_item(["spec", "volumes"], _list_or_none(volumes), lib_volume())
    if COPY_CONTAINER not in _names(inits):
        copier = copy_container(policy.lib_image)
        yield insert_first(["spec", "initContainers"], _list_or_none(inits), copier)


def _scheduler_ops(pod: Mapping[str, Any], policy: MutationPolicy) -> Iterator[Op]:
    spec = mapping(pod.get("spec"))
    current = str(spec.get("schedulerName") or "")
    if current == policy.scheduler_name:
        return
    if current not in ("", DEFAULT_SCHEDULER):
        raise AdmissionDenied(
            f"pod {pod_label(pod)} asks for remote GPUs but names scheduler {current!r}; only "
            f"{policy.scheduler_name!r} can allocate them: set spec.schedulerName to "
            f"{policy.scheduler_name!r} or leave it empty"
        )
    yield put(["spec", "schedulerName"], policy.scheduler_name, exists="schedulerName" in spec)


def _annotation_ops(pod: Mapping[str, Any], traceparent: str | None) -> Iterator[Op]:
    annotations = _annotations(pod)
    present = annotations or {}
    wanted = {MARKER_ANNOTATION: "true"}
    if traceparent is not None and creation_context(present.get(TRACE_ANNOTATION)) is None:
        wanted[TRACE_ANNOTATION] = traceparent
    missing = {key: value for key, value in wanted.items() if present.get(key) != value}
    if annotations is None and missing:
        yield {"op": "add", "path": pointer("metadata", "annotations"), "value": missing}
        return
    for key, value in missing.items():
        yield put_member(["metadata", "annotations"], annotations, key, value)
