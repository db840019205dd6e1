"""A GPU pod is only schedulable and runnable by rgpu once it names our
scheduler, reads its endpoint through the downward API and, when memory is capped, preloads
HAMi-core; the webhook adds all of that at CREATE, refusing what would defeat it.

The result is idempotent: mutating an already-mutated pod yields no operations, so the webhook
is safe under ``reinvocationPolicy: IfNeeded`` and under apiserver retries.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rgpu_contracts import ANNOTATION_ENDPOINT
from rgpu_placement import ContainerDemand, InvalidQuantity, PodDemand, read_demand
from rgpu_runtime import Settings

from .envlist import env_list, set_env
from .errors import AdmissionDenied
from .hamicore import COPY_CONTAINER, LIB_VOLUME, copy_container, lib_env, lib_mount, lib_volume
from .patching import Op, append_item, insert_first, put, put_member
from .pods import mapping, pod_label
from .wiring import wired_env

__all__ = ["DEFAULT_SCHEDULER", "MARKER_ANNOTATION", "MutationPolicy", "is_owned", "mutate_pod"]

DEFAULT_SCHEDULER = "default-scheduler"
MARKER_ANNOTATION = "hami.io/webhook-mutated"
_OWNED_PREFIXES = ("hami.io/remote-gpu-devices-", "rgpu.io/")


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

    @classmethod
    def from_settings(cls, settings: Settings) -> MutationPolicy:
        return cls(
            count_resource=settings.resources.count,
            memory_resource=settings.resources.memory,
            scheduler_name=settings.scheduling.scheduler_name,
            card_mode=settings.scheduling.granularity == "card",
            lib_image=settings.scheduling.lib_image,
        )


def mutate_pod(pod: Mapping[str, Any], policy: MutationPolicy) -> tuple[Op, ...]:
    """The JSONPatch a new pod needs; ``()`` for a pod that asks for no cards.

    Raises ``AdmissionDenied`` with a message the pod's author can act on.
    """
    demand = _demand(pod, policy)
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
        *_marker_ops(pod),
    )


def _demand(pod: Mapping[str, Any], policy: MutationPolicy) -> PodDemand:
    try:
        return read_demand(
            pod, count_resource=policy.count_resource, memory_resource=policy.memory_resource
        )
    except InvalidQuantity as exc:
        raise AdmissionDenied(f"pod {pod_label(pod)}: {exc}") from exc


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    value = mapping(pod.get("metadata")).get("annotations")
    return value if isinstance(value, Mapping) else None


def _refuse_owned_annotations(pod: Mapping[str, Any], policy: MutationPolicy) -> None:
    owned = sorted(key for key in _annotations(pod) or {} if is_owned(key))
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


def _marker_ops(pod: Mapping[str, Any]) -> Iterator[Op]:
    annotations = _annotations(pod)
    if (annotations or {}).get(MARKER_ANNOTATION) != "true":
        yield put_member(["metadata", "annotations"], annotations, MARKER_ANNOTATION, "true")
