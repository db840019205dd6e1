"""Raw Kubernetes objects as kube-apiserver holds them, for tests that seed the simulated
apiserver or feed a parser: the smallest valid pod, container and node, each field a keyword
with a default, so a test spells out only what it is about.

They return plain dicts (the wire shape), not typed models: what the code under test reads is
JSON, and a test may break the shape on purpose.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "Json",
    "container_manifest",
    "node_manifest",
    "pod_manifest",
    "register_annotation",
    "register_card",
]

Json = dict[str, Any]

HEARTBEAT = "2026-11-29T10:00:00Z"


def container_manifest(
    *,
    name: str = "main",
    image: str = "busybox:1.36",
    limits: Mapping[str, object] | None = None,
    env: Iterable[Json] | None = None,
) -> Json:
    """A container running ``image``, with resource ``limits`` and ``env`` when given."""
    body: Json = {"name": name, "image": image}
    if limits is not None:
        body["resources"] = {"limits": dict(limits)}
    if env is not None:
        body["env"] = list(env)
    return body


def pod_manifest(
    *,
    name: str = "p",
    namespace: str = "default",
    uid: str | None = None,
    containers: Iterable[Json] | None = None,
    init_containers: Iterable[Json] = (),
    scheduler: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    node: str | None = None,
    spec: Mapping[str, object] | None = None,
) -> Json:
    """A v1 Pod; one ``busybox`` container named ``main`` unless ``containers`` are given.
    ``spec`` adds (or overrides) spec fields; ``node`` sets ``spec.nodeName``."""
    meta: Json = {"name": name, "namespace": namespace}
    for key, value in (("uid", uid), ("annotations", annotations), ("labels", labels)):
        if value is not None:
            meta[key] = value if isinstance(value, str) else dict(value)
    body: Json = {"containers": list(containers or [container_manifest()])}
    if init := list(init_containers):
        body["initContainers"] = init
    if scheduler is not None:
        body["schedulerName"] = scheduler
    if node is not None:
        body["nodeName"] = node
    body.update(spec or {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def node_manifest(
    *,
    name: str = "n",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    ready: bool | str = True,
    address: str | None = None,
    taints: Iterable[Mapping[str, str]] = (),
    unschedulable: bool = False,
) -> Json:
    """A v1 Node with a ``Ready`` condition (``ready`` may be ``"Unknown"``) and, when given,
    an ``InternalIP`` ``address``, ``taints`` and ``unschedulable``."""
    spec: Json = {}
    if taint_list := [dict(t) for t in taints]:
        spec["taints"] = taint_list
    if unschedulable:
        spec["unschedulable"] = True
    status = ready if isinstance(ready, str) else str(ready)
    condition = {"type": "Ready", "status": status, "lastHeartbeatTime": HEARTBEAT}
    node_status: Json = {"conditions": [condition]}
    if address is not None:
        node_status["addresses"] = [{"type": "InternalIP", "address": address}]
    meta: Json = {"name": name, "labels": dict(labels or {})}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "spec": spec,
        "status": node_status,
    }


def register_card(
    *,
    uuid: str = "GPU-0",
    index: int = 0,
    count: int = 10,
    memory_mib: int = 40960,
    cores: int = 100,
    model: str = "NVIDIA-A100-SXM4-40GB",
    mode: str = "remote",
    healthy: bool = True,
) -> Json:
    """One card as HAMi's device plugin registers it on a node (``count`` = share slots)."""
    return {
        "id": uuid,
        "index": index,
        "count": count,
        "devmem": memory_mib,
        "devcore": cores,
        "type": model,
        "mode": mode,
        "health": healthy,
    }


def register_annotation(cards: Iterable[Json]) -> str:
    """The register annotation's value for ``cards``: compact JSON, as Go writes it."""
    return json.dumps(list(cards), separators=(",", ":"))


def binding_manifest(name: str, *, role: str, user: str, role_kind: str = "ClusterRole") -> Json:
    """A RoleBinding or ClusterRoleBinding (the same body) of ``role`` to ``user``: a
    ``system:serviceaccount:<ns>:<name>`` user is bound as that ServiceAccount, any other as a
    User. Create it as ``rolebindings`` (with a namespace) or ``clusterrolebindings``."""
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        subject = {"kind": "ServiceAccount", "name": parts[3], "namespace": parts[2]}
    else:
        subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}
    return {"metadata": {"name": name}, "roleRef": ref, "subjects": [subject]}
