"""Filter, prioritize, bind and the webhook all read raw pod and Node JSON (as
kube-scheduler and the apiserver send it), and must agree on who the pod is and which node is
which (where each container sits and what it asks for is ``rgpu_placement.read_demand``'s to
say).

Objects arrive as plain JSON mappings, not typed objects: the extender only reads a handful of
fields, and decoding the whole PodSpec or Node would cost time on kube-scheduler's serial hot
path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rgpu_contracts import PodRef, PodUID

__all__ = ["mapping", "node_labels", "node_name", "pod_label", "pod_ref"]


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one (absent and ``null`` read alike)."""
    # The exact type first: decoded JSON is all dicts, and the abstract check costs more.
    return value if value.__class__ is dict or isinstance(value, Mapping) else {}


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


def node_name(node: object) -> str:
    """A Node's ``metadata.name`` (empty when absent)."""
    return str(mapping(mapping(node).get("metadata")).get("name", ""))


def node_labels(node: object) -> Mapping[str, str]:
    """A Node's ``metadata.labels`` as strings."""
    labels: Mapping[str, Any] = mapping(mapping(mapping(node).get("metadata")).get("labels"))
    return {str(k): str(v) for k, v in labels.items()}
