"""Why this module exists: claim validity, repair and wake-up all ask "what is this pod doing
now?", and the allocator watches every pod in the cluster to answer without a round trip.

At 100,000 pods memory matters more than convenience, so a pod is kept as a slotted record
of the handful of fields allocation needs; repeated strings (namespaces, node names, phases,
scheduler names) are interned so thousands of pods share one copy.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from rgpu_contracts import ANNOTATION_ALLOCATED, PodRef, PodUID

__all__ = ["FINISHED_PHASES", "PodIndex", "PodInfo", "pod_info"]

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True, kw_only=True)
class PodInfo:
    """What allocation needs to know about one pod, and nothing more."""

    uid: PodUID
    namespace: str
    name: str
    node_name: str | None
    phase: str
    scheduler_name: str
    has_allocated: bool
    """Whether the pod carries ``hami.io/remote-gpu-devices-allocated`` (repair reads it fresh)."""

    @property
    def ref(self) -> PodRef:
        return PodRef(uid=self.uid, namespace=self.namespace, name=self.name)

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @property
    def bound(self) -> bool:
        return bool(self.node_name)


def _mapping(raw: object) -> Mapping[str, object]:
    return raw if isinstance(raw, Mapping) else {}


def _text(raw: Mapping[str, object], key: str) -> str:
    value = raw.get(key)
    return value if isinstance(value, str) else ""


def pod_info(raw: Mapping[str, object]) -> PodInfo | None:
    """Slim a raw Pod (as the apiserver sends it) down to a ``PodInfo``; ``None`` without a uid."""
    meta = _mapping(raw.get("metadata"))
    spec = _mapping(raw.get("spec"))
    status = _mapping(raw.get("status"))
    uid = _text(meta, "uid")
    if not uid:
        return None
    node = _text(spec, "nodeName")
    return PodInfo(
        uid=PodUID(uid),
        namespace=sys.intern(_text(meta, "namespace")),
        name=_text(meta, "name"),
        node_name=sys.intern(node) if node else None,
        phase=sys.intern(_text(status, "phase") or "Pending"),
        scheduler_name=sys.intern(_text(spec, "schedulerName") or "default-scheduler"),
        has_allocated=ANNOTATION_ALLOCATED in _mapping(meta.get("annotations")),
    )


class PodIndex:
    """Every pod the watch has delivered, by uid; replaced wholesale on relist."""

    __slots__ = ("_pods",)

    def __init__(self) -> None:
        self._pods: dict[PodUID, PodInfo] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def __iter__(self) -> Iterator[PodInfo]:
        return iter(tuple(self._pods.values()))

    def get(self, uid: str) -> PodInfo | None:
        return self._pods.get(PodUID(uid))

    def put(self, pod: PodInfo) -> PodInfo | None:
        """Store ``pod``; returns what was stored before under its uid."""
        before = self._pods.get(pod.uid)
        self._pods[pod.uid] = pod
        return before

    def remove(self, uid: str) -> PodInfo | None:
        return self._pods.pop(PodUID(uid), None)

    def replace_all(self, pods: Mapping[PodUID, PodInfo]) -> tuple[PodInfo, ...]:
        """Swap in a fresh list's content; returns the pods that vanished in between."""
        gone = tuple(p for uid, p in self._pods.items() if uid not in pods)
        self._pods = dict(pods)
        return gone
