"""A pod behind rgpu's scheduling gate is admitted by the allocator itself, so the pod watch
must carry what admission decides on — the pod's ask, where it may run, when it was created,
the version to lift the gate against — and only for those pods: at 100,000 pods in the cache,
every other pod stays as slim as before.

Where a pod may run is read from its own spec as kube-scheduler reads it: ``nodeSelector``
(every label must match) and the required node affinity (any one term; every expression of a
term). Only the locality rule uses it, to prefer servers near nodes the pod may run on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rgpu_contracts import ContainerRequest
from rgpu_placement import (
    ADMISSION_GATE,
    Gang,
    InvalidQuantity,
    gang_of,
    read_demand,
    scheduling_gates,
    waits_for_rgpu,
)
from rgpu_runtime.settings import ResourceSettings
from rgpu_runtime.telemetry import TRACE_ANNOTATION

__all__ = ["Expression", "Gated", "Placement", "read_gated"]

MAX_TRACEPARENT = 256
"""A W3C traceparent is 55 characters; anything much longer is not one (and is not kept)."""

Expression = tuple[str, str, tuple[str, ...]]
"""One node selector requirement: (label key, operator, values)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where the pod may run: every selector label, and one of the affinity terms."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[Expression, ...], ...] = ()
    """The required node affinity's terms (ORed); empty when the pod has none."""

    @property
    def anywhere(self) -> bool:
        return not self.selector and not self.terms


@dataclass(frozen=True, slots=True, kw_only=True)
class Gated:
    """What admission needs of a pod carrying rgpu's gate."""

    gates: tuple[str, ...]
    resource_version: str
    created_at: float
    containers: tuple[ContainerRequest, ...]
    """Every container's ask, pod order; empty when the ask could not be read (``problem``)."""
    problem: str | None
    """Why the pod's ask is unreadable (the webhook refuses such pods; a pod created while it
    was down may still carry one)."""
    placement: Placement
    cuda_major: int | None = None
    """The CUDA major version the pod asks for (``rgpu.io/cuda-major``; ``None``: any)."""
    gang: Gang | None = None
    """The gang the pod belongs to (``rgpu.io/gang`` and ``rgpu.io/gang-size`` labels)."""
    trace: str | None = None
    """The pod's creation as the webhook recorded it (``rgpu.io/trace``), for span links."""

    @property
    def ours(self) -> bool:
        """Whether rgpu's gate is the last one left: the pod is rgpu's to admit now."""
        return waits_for_rgpu(self.gates)


def _mapping(raw: object) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _list(raw: object) -> list[Any]:
    return raw if isinstance(raw, list) else []


def _moment(text: object) -> float:
    if not isinstance(text, str) or not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _trace(meta: Mapping[str, Any]) -> str | None:
    value = _mapping(meta.get("annotations")).get(TRACE_ANNOTATION)
    return value if isinstance(value, str) and len(value) <= MAX_TRACEPARENT else None


def _labels(meta: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}


def _expression(raw: object) -> Expression:
    m = _mapping(raw)
    values = tuple(str(v) for v in _list(m.get("values")))
    return str(m.get("key") or ""), str(m.get("operator") or ""), values


def _placement(spec: Mapping[str, Any]) -> Placement:
    selector = tuple(
        sorted((str(k), str(v)) for k, v in _mapping(spec.get("nodeSelector")).items())
    )
    node_affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = _mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = tuple(
        tuple(_expression(e) for e in _list(_mapping(t).get("matchExpressions")))
        for t in _list(required.get("nodeSelectorTerms"))
    )
    return Placement(selector=selector, terms=terms)


def _ask(
    raw: Mapping[str, Any], resources: ResourceSettings
) -> tuple[tuple[ContainerRequest, ...], int | None, str | None]:
    try:
        demand = read_demand(raw, count_resource=resources.count, memory_resource=resources.memory)
    except InvalidQuantity as exc:
        return (), None, str(exc)
    if not demand.asks:
        return (), None, f"no container asks for {resources.count}"
    return demand.requests(), demand.cuda_major, None


def read_gated(raw: Mapping[str, Any], resources: ResourceSettings) -> Gated | None:
    """The admission facts of a raw pod carrying rgpu's gate; ``None`` for any other pod."""
    gates = scheduling_gates(raw)
    if ADMISSION_GATE not in gates:
        return None
    meta, spec = _mapping(raw.get("metadata")), _mapping(raw.get("spec"))
    containers, cuda_major, problem = _ask(raw, resources)
    version = meta.get("resourceVersion")
    return Gated(
        gates=gates,
        resource_version=version if isinstance(version, str) else "",
        created_at=_moment(meta.get("creationTimestamp")),
        containers=containers,
        problem=problem,
        placement=_placement(spec),
        cuda_major=cuda_major,
        gang=gang_of(str(meta.get("namespace") or ""), _labels(meta)),
        trace=_trace(meta),
    )
