"""A Node object from the apiserver is a large, loosely typed JSON
document, and discovery needs six facts from it. Reading them in one place, tolerantly, keeps
the rest of the service working on a small frozen value instead of nested dicts.

A node is a **server** when it carries the ``hami.io/lupine-server`` label (any value, even
empty); every other node is a **client** node, of which only the topology labels matter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rgpu_contracts.hami import ANNOTATION_REGISTER, LABEL_SERVER
from rgpu_contracts.ids import NodeName

from .errors import MalformedNode

__all__ = ["NodeView", "node_name", "node_view"]

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """What discovery reads from one Node.

    ``server_label`` is the ``hami.io/lupine-server`` value (``None`` on a client node),
    ``register`` the raw register annotation, ``internal_ip`` the first ``InternalIP``,
    ``ready`` whether the ``Ready`` condition is ``True``, and ``topology`` the configured
    topology labels present on the node, in the configured order.
    """

    name: NodeName
    uid: str
    server_label: str | None
    register: str | None
    internal_ip: str | None
    ready: bool
    topology: Labels

    @property
    def is_server(self) -> bool:
        """Whether this node serves GPUs through lupine."""
        return self.server_label is not None


def node_view(raw: Mapping[str, object], topology_keys: Sequence[str]) -> NodeView:
    """Read a Node object; raises ``MalformedNode`` when it has no ``metadata.name``."""
    metadata = _mapping(raw.get("metadata"))
    status = _mapping(raw.get("status"))
    labels = _mapping(metadata.get("labels"))
    annotations = _mapping(metadata.get("annotations"))
    return NodeView(
        name=node_name(raw),
        uid=_text(metadata.get("uid")) or "",
        server_label=_text(labels.get(LABEL_SERVER)),
        register=_text(annotations.get(ANNOTATION_REGISTER)),
        internal_ip=_first_internal_ip(status.get("addresses")),
        ready=_is_ready(status.get("conditions")),
        topology=_topology(labels, topology_keys),
    )


def node_name(raw: Mapping[str, object]) -> NodeName:
    """``metadata.name`` of a Node; raises ``MalformedNode`` when absent or empty."""
    name = _text(_mapping(raw.get("metadata")).get("name"))
    if not name:
        raise MalformedNode("a Node object without metadata.name was received; it is ignored")
    return NodeName(name)


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _first_internal_ip(addresses: object) -> str | None:
    # The kubelet lists addresses in preference order; HAMi takes the first InternalIP.
    for address in addresses if isinstance(addresses, list) else ():
        entry = _mapping(address)
        value = _text(entry.get("address"))
        if entry.get("type") == "InternalIP" and value:
            return value
    return None


def _is_ready(conditions: object) -> bool:
    for condition in conditions if isinstance(conditions, list) else ():
        entry = _mapping(condition)
        if entry.get("type") == "Ready":
            return entry.get("status") == "True"
    return False


def _topology(labels: Mapping[str, object], keys: Sequence[str]) -> Labels:
    pairs = ((key, labels.get(key)) for key in keys)
    return tuple((key, value) for key, value in pairs if isinstance(value, str))
