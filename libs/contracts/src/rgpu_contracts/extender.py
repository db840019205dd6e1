"""Kube-scheduler's extender types have no JSON tags in Go, so the wire
keys are the Go field names (PascalCase); decoding tolerates any case, encoding writes every
field (``null`` allowed) because that is what kube-scheduler itself produces and expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypedDict

from . import _validate as v
from .errors import ContractError

__all__ = [
    "ExtenderArgs",
    "ExtenderArgsDict",
    "ExtenderBindingArgs",
    "ExtenderBindingResult",
    "ExtenderFilterResult",
    "ExtenderFilterResultDict",
    "HostPriority",
    "decode_host_priorities",
    "encode_host_priorities",
]


def _folded(raw: object, path: str, *names: str) -> Mapping[str, object]:
    """Return the object keyed by the canonical ``names``, matched case-insensitively.

    Go's encoding/json matches keys without regard to case, so kube-scheduler (and hand-written
    clients) may send ``nodenames`` or ``NodeNames``; error paths still use the Go field name.
    """
    canonical = {name.lower(): name for name in names}
    m = v.as_mapping(raw, path)
    return {canonical.get(str(k).lower(), str(k)): value for k, value in m.items()}


def _frozen(raw: object, path: str) -> Mapping[str, Any]:
    v.shallow(raw, path)
    return MappingProxyType(dict(v.as_mapping(raw, path)))


def _opt_names(m: Mapping[str, object], key: str, path: str) -> tuple[str, ...] | None:
    if m.get(key) is None:
        return None
    return v.items(m, key, path, _node_name)


def _node_name(raw: object, path: str) -> str:
    if not isinstance(raw, str):
        raise ContractError(path, f"expected a node name (string), got {v.type_name(raw)}")
    return v.limited(raw, path, v.MAX_NAME_CHARS)


def _pod(raw: object, path: str) -> Mapping[str, Any]:
    """The pod kept as JSON, its identity checked: every verb reads name, namespace and uid."""
    pod = _frozen(raw, path)
    meta_path = v.join(path, "metadata")
    meta = _meta(pod, meta_path)
    v.opt_limited(meta, "name", meta_path, v.MAX_NAME_CHARS)
    v.opt_limited(meta, "namespace", meta_path, v.MAX_NAMESPACE_CHARS)
    v.opt_limited(meta, "uid", meta_path, v.MAX_UID_CHARS)
    return pod


def _meta(obj: Mapping[str, Any], path: str) -> Mapping[str, object]:
    value = obj.get("metadata")
    return {} if value is None else v.as_mapping(value, path)


def _nodes(raw: object, path: str) -> Mapping[str, Any]:
    """Full Nodes kept as JSON, with ``items`` checked to be Nodes that have a name."""
    nodes = _frozen(raw, path)
    if nodes.get("items") is not None:
        v.items(nodes, "items", path, _named_node)
    return nodes


def _named_node(raw: object, path: str) -> None:
    node = v.as_mapping(raw, path)
    meta_path = v.join(path, "metadata")
    meta = _meta(node, meta_path)
    v.opt_limited(meta, "name", meta_path, v.MAX_NAME_CHARS)


def _string_map(m: Mapping[str, object], key: str, path: str) -> tuple[tuple[str, str], ...]:
    return () if m.get(key) is None else v.string_map(m, key, path)


class ExtenderArgsDict(TypedDict):
    Pod: dict[str, Any]
    Nodes: dict[str, Any] | None
    NodeNames: list[str] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtenderArgs:
    """Body of ``/filter`` and ``/prioritize``: the pod and ``NodeNames`` or full ``Nodes``."""

    pod: Mapping[str, Any] = field(hash=False)
    nodes: Mapping[str, Any] | None = field(default=None, hash=False)
    node_names: tuple[str, ...] | None = None

    def candidate_names(self) -> tuple[str, ...]:
        """Node names from ``NodeNames`` (nodeCacheCapable) or from the ``Nodes`` list."""
        if self.node_names is not None:
            return self.node_names
        items = (self.nodes or {}).get("items") or []
        return tuple(str((n.get("metadata") or {}).get("name") or "") for n in items)

    def to_dict(self) -> ExtenderArgsDict:
        return {
            "Pod": dict(self.pod),
            "Nodes": dict(self.nodes) if self.nodes is not None else None,
            "NodeNames": list(self.node_names) if self.node_names is not None else None,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ExtenderArgs:
        m = _folded(raw, path, "Pod", "Nodes", "NodeNames")
        if m.get("Pod") is None:
            raise ContractError(v.join(path, "Pod"), "is required")
        nodes = m.get("Nodes")
        return cls(
            pod=_pod(m["Pod"], v.join(path, "Pod")),
            nodes=None if nodes is None else _nodes(nodes, v.join(path, "Nodes")),
            node_names=_opt_names(m, "NodeNames", path),
        )


class ExtenderFilterResultDict(TypedDict):
    Nodes: dict[str, Any] | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str] | None
    FailedAndUnresolvableNodes: dict[str, str] | None
    Error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtenderFilterResult:
    """Reply of ``/filter``; ``error`` non-empty makes kube-scheduler back the pod off and retry."""

    node_names: tuple[str, ...] | None = None
    failed_nodes: tuple[tuple[str, str], ...] = ()
    failed_and_unresolvable: tuple[tuple[str, str], ...] = ()
    error: str = ""
    nodes: Mapping[str, Any] | None = field(default=None, hash=False)

    def to_dict(self) -> ExtenderFilterResultDict:
        return {
            "Nodes": dict(self.nodes) if self.nodes is not None else None,
            "NodeNames": list(self.node_names) if self.node_names is not None else None,
            "FailedNodes": dict(self.failed_nodes) if self.failed_nodes else None,
            "FailedAndUnresolvableNodes": (
                dict(self.failed_and_unresolvable) if self.failed_and_unresolvable else None
            ),
            "Error": self.error,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ExtenderFilterResult:
        m = _folded(raw, path, *ExtenderFilterResultDict.__annotations__)
        nodes = m.get("Nodes")
        return cls(
            nodes=None if nodes is None else _frozen(nodes, v.join(path, "Nodes")),
            node_names=_opt_names(m, "NodeNames", path),
            failed_nodes=_string_map(m, "FailedNodes", path),
            failed_and_unresolvable=_string_map(m, "FailedAndUnresolvableNodes", path),
            error=_opt_text(m, "Error", path),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HostPriority:
    """One entry of ``/prioritize``'s bare array: ``Host`` scored 0 to 10."""

    host: str
    score: int

    def to_dict(self) -> dict[str, object]:
        return {"Host": self.host, "Score": self.score}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> HostPriority:
        m = _folded(raw, path, "Host", "Score")
        return cls(host=v.string(m, "Host", path), score=v.integer(m, "Score", path))


def encode_host_priorities(priorities: tuple[HostPriority, ...]) -> list[dict[str, object]]:
    """``/prioritize`` answers a bare JSON array, not an object."""
    return [p.to_dict() for p in priorities]


def decode_host_priorities(raw: object, path: str = "") -> tuple[HostPriority, ...]:
    """Decode ``/prioritize``'s bare array."""
    return tuple(
        HostPriority.from_dict(e, v.join(path, i)) for i, e in enumerate(v.as_list(raw, path))
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtenderBindingArgs:
    """Body of ``/bind``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    def to_dict(self) -> dict[str, str]:
        return {
            "PodName": self.pod_name,
            "PodNamespace": self.pod_namespace,
            "PodUID": self.pod_uid,
            "Node": self.node,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ExtenderBindingArgs:
        m = _folded(raw, path, *_BINDING_LIMITS)
        values = [_required_text(m, name, path, most) for name, most in _BINDING_LIMITS.items()]
        return cls(pod_name=values[0], pod_namespace=values[1], pod_uid=values[2], node=values[3])


_BINDING_LIMITS = {
    "PodName": v.MAX_NAME_CHARS,
    "PodNamespace": v.MAX_NAMESPACE_CHARS,
    "PodUID": v.MAX_UID_CHARS,
    "Node": v.MAX_NAME_CHARS,
}


def _required_text(m: Mapping[str, object], name: str, path: str, max_chars: int) -> str:
    value = m.get(name)
    if not isinstance(value, str) or not value:
        raise ContractError(
            v.join(path, name), f"expected a non-empty string, got {v.type_name(value)}"
        )
    return v.limited(value, v.join(path, name), max_chars)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtenderBindingResult:
    """Reply of ``/bind``: empty ``Error`` means bound."""

    error: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"Error": self.error}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ExtenderBindingResult:
        return cls(error=_opt_text(_folded(raw, path, "Error"), "Error", path))


def _opt_text(m: Mapping[str, object], key: str, path: str) -> str:
    return "" if m.get(key) is None else v.string(m, key, path)
