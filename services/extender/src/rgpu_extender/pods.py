"""Filter, bind and the webhook all read raw pod JSON (as kube-scheduler
and the apiserver send it), and must agree on who the pod is and where each container sits.

Pods arrive as plain JSON mappings, not typed objects: the extender only reads a handful of
fields, and decoding the whole PodSpec would cost time on kube-scheduler's serial hot path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rgpu_contracts import ContainerKind, PodRef, PodUID

__all__ = ["ContainerSlot", "Section", "container_slots", "mapping", "pod_label", "pod_ref"]

Section = Literal["initContainers", "containers"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerSlot:
    """One container of a pod spec: where it sits (for patches) and how Kubernetes counts it."""

    section: Section
    index: int
    kind: ContainerKind
    name: str
    body: Mapping[str, Any]


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one (absent and ``null`` read alike)."""
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _kind(section: Section, body: Mapping[str, Any]) -> ContainerKind:
    if section == "containers":
        return ContainerKind.APP
    # A native sidecar is an init container that keeps running beside the app containers.
    return ContainerKind.SIDECAR if body.get("restartPolicy") == "Always" else ContainerKind.INIT


def container_slots(pod: Mapping[str, Any]) -> Iterator[ContainerSlot]:
    """Yield init containers (sidecars included) then app containers, in pod order."""
    spec = mapping(pod.get("spec"))
    sections: tuple[Section, ...] = ("initContainers", "containers")
    for section in sections:
        for index, raw in enumerate(_list(spec.get(section))):
            body = mapping(raw)
            name = str(body.get("name") or f"{section}[{index}]")
            kind = _kind(section, body)
            yield ContainerSlot(section=section, index=index, kind=kind, name=name, body=body)


def pod_label(pod: Mapping[str, Any], namespace: str = "") -> str:
    """``namespace/name`` for messages; ``namespace/<generateName>*`` before a name exists.

    ``namespace`` stands in when the object has none (a pod being created may not yet).
    """
    meta = mapping(pod.get("metadata"))
    namespace = str(meta.get("namespace") or namespace or "default")
    name = meta.get("name") or f"{meta.get('generateName') or ''}*"
    return f"{namespace}/{name}"


def pod_ref(pod: Mapping[str, Any]) -> PodRef:
    """The pod's identity as the allocator knows it (uid, namespace, name)."""
    meta = mapping(pod.get("metadata"))
    return PodRef(
        uid=PodUID(str(meta.get("uid") or "")),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
    )
