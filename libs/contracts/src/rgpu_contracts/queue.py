"""Operators ask "who waits for a remote GPU, in which order, and why": the allocator answers
with this contract (``GET /v1/queue``), which ``rgpu queue`` and ``rgpu explain`` read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from . import _validate as v
from .allocation import PodRef, PodRefDict

__all__ = [
    "AdmissionQueue",
    "AdmissionQueueDict",
    "NamespaceShare",
    "NamespaceShareDict",
    "QueuedPod",
    "QueuedPodDict",
]


class QueuedPodDict(TypedDict):
    pod: PodRefDict
    position: int
    priority: int
    cards: int
    reason: str
    message: str
    since: float


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedPod:
    """One gated pod: its place in line (0 first), what it asks and why it waits."""

    pod: PodRef
    position: int
    priority: int
    cards: int
    """Cards the pod asks for at once (its largest container's count in server granularity)."""
    reason: str
    """Why it waits (``NoFit``, ``NeverFits``, ``Preempting``, …) or ``Admitting``."""
    message: str
    since: float
    """When the pod was created (wall-clock seconds)."""

    def to_dict(self) -> QueuedPodDict:
        return {
            "pod": self.pod.to_dict(),
            "position": self.position,
            "priority": self.priority,
            "cards": self.cards,
            "reason": self.reason,
            "message": self.message,
            "since": self.since,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> QueuedPod:
        m = v.as_mapping(raw, path)
        return cls(
            pod=PodRef.from_dict(m.get("pod"), v.join(path, "pod")),
            position=v.integer(m, "position", path, minimum=0),
            priority=v.integer(m, "priority", path),
            cards=v.integer(m, "cards", path, minimum=0),
            reason=v.string(m, "reason", path),
            message=v.string(m, "message", path, ""),
            since=v.number(m, "since", path),
        )


class NamespaceShareDict(TypedDict):
    namespace: str
    held: int
    quota: int | None
    weight: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NamespaceShare:
    """A namespace's part of the pool: cards held (or admitted), its quota and weight."""

    namespace: str
    held: int
    quota: int | None
    """``None``: no limit."""
    weight: int

    def to_dict(self) -> NamespaceShareDict:
        return {
            "namespace": self.namespace,
            "held": self.held,
            "quota": self.quota,
            "weight": self.weight,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> NamespaceShare:
        m = v.as_mapping(raw, path)
        quota = m.get("quota")
        return cls(
            namespace=v.string(m, "namespace", path),
            held=v.integer(m, "held", path, minimum=0),
            quota=None if quota is None else v.integer(m, "quota", path, minimum=0),
            weight=v.integer(m, "weight", path, minimum=1),
        )


class AdmissionQueueDict(TypedDict):
    pods: list[QueuedPodDict]
    namespaces: list[NamespaceShareDict]
    configProblem: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionQueue:
    """Every pod waiting behind rgpu's scheduling gate, in admission order, and how the pool
    is shared between namespaces."""

    pods: tuple[QueuedPod, ...]
    namespaces: tuple[NamespaceShare, ...] = ()
    config_problem: str | None = None
    """Why the newest queue configuration was refused (the last good one is in force)."""

    def to_dict(self) -> AdmissionQueueDict:
        return {
            "pods": [p.to_dict() for p in self.pods],
            "namespaces": [n.to_dict() for n in self.namespaces],
            "configProblem": self.config_problem,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> AdmissionQueue:
        m = v.as_mapping(raw, path)
        return cls(
            pods=v.items(m, "pods", path, QueuedPod.from_dict),
            namespaces=v.items(m, "namespaces", path, NamespaceShare.from_dict, ()),
            config_problem=v.opt_string(m, "configProblem", path),
        )
