"""Locality needs client nodes' topology labels without every service
watching every Node; discovery publishes them once, as this contract."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from . import _validate as v
from .ids import NodeName

__all__ = ["NodeTopology", "NodeTopologyDict", "Topology", "TopologyDict"]


class NodeTopologyDict(TypedDict):
    name: str
    labels: dict[str, str]


class TopologyDict(TypedDict):
    revision: int
    nodes: list[NodeTopologyDict]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeTopology:
    """A node's topology labels, limited to the configured topology keys."""

    name: NodeName
    labels: tuple[tuple[str, str], ...]

    def to_dict(self) -> NodeTopologyDict:
        return {"name": self.name, "labels": dict(self.labels)}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> NodeTopology:
        m = v.as_mapping(raw, path)
        return cls(
            name=NodeName(v.string(m, "name", path)), labels=v.string_map(m, "labels", path, {})
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """Topology labels of every node, at a ``revision`` that moves when any of them changes."""

    revision: int
    nodes: tuple[NodeTopology, ...]

    def labels_of(self) -> dict[str, dict[str, str]]:
        """Index by node name, for lookups on the hot path."""
        return {node.name: dict(node.labels) for node in self.nodes}

    def to_dict(self) -> TopologyDict:
        return {"revision": self.revision, "nodes": [n.to_dict() for n in self.nodes]}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> Topology:
        m = v.as_mapping(raw, path)
        return cls(
            revision=v.integer(m, "revision", path, minimum=0),
            nodes=v.items(m, "nodes", path, NodeTopology.from_dict),
        )
