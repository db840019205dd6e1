"""Lupine servers run as pods, the way k8s/components/lupine-server deploys them.

When a cluster runs lupine as a DaemonSet, each server is a pod on its node, and a
NetworkPolicy can select it. The fake lupine servers listen on their node's address; these
pods stand for them in the apiserver: one Running pod per fake server, on the server's node,
on the pod network (``hostNetwork: false``) with its lupine port as both ``containerPort`` and
``hostPort``, so the simulated network (``PodNetwork``) sends a connection to the node's port to
this pod, and the policies that select the pod decide who gets in. They are written Running
and Ready (as a kubelet that started them long ago would have left them), so the kubelet
emulator leaves them alone.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from rgpu_kubesim.lupine import FakeLupine

__all__ = ["LUPINE_LABELS", "LUPINE_NAMESPACE", "lupine_pod", "place_lupine_pods"]

Manifest = dict[str, Any]

LUPINE_NAMESPACE: Final = "rgpu-lupine"
"""The namespace k8s/components/lupine-server runs lupine in."""
LUPINE_LABELS: Final = {
    "app.kubernetes.io/name": "lupine-server",
    "app.kubernetes.io/component": "lupine-server",
    "app.kubernetes.io/part-of": "rgpu",
}
"""The DaemonSet's pod labels."""
_FIRST_ADDRESS: Final = int(ipaddress.IPv4Address("127.255.0.2"))
"""Lupine pods' own addresses: 127.255.0.0/16, which the kubelets never lease."""


class PodStore(Protocol):
    """What placing pods needs of the simulated apiserver's ``Store``."""

    def create(self, resource: str, obj: Mapping[str, Any], /) -> Mapping[str, Any]: ...

    def list(self, resource: str, /) -> list[dict[str, Any]]: ...


def lupine_pod(
    server: FakeLupine,
    *,
    index: int,
    namespace: str = LUPINE_NAMESPACE,
    labels: Mapping[str, str] = LUPINE_LABELS,
) -> Manifest:
    """The Running pod standing for ``server`` (``index`` picks its own address)."""
    name = f"lupine-server-{server.node}" + (
        f"-{server.port}" if server.name != server.node else ""
    )
    address = str(ipaddress.IPv4Address(_FIRST_ADDRESS + index))
    port = {"name": "lupine", "containerPort": server.port, "hostPort": server.port}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "nodeName": server.node,
            "hostNetwork": False,
            "tolerations": [{"key": "hami.io/lupine-server", "operator": "Exists"}],
            "containers": [
                {
                    "name": "lupine-server",
                    "image": "ghcr.io/rgpu/lupine-server",
                    "ports": [{**port, "protocol": "TCP"}],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "hostIP": server.host,
            "hostIPs": [{"ip": server.host}],
            "podIP": address,
            "podIPs": [{"ip": address}],
            "conditions": [
                {"type": kind, "status": "True"} for kind in ("Ready", "ContainersReady")
            ],
            "containerStatuses": [
                {
                    "name": "lupine-server",
                    "image": "ghcr.io/rgpu/lupine-server",
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {}},
                }
            ],
        },
    }


def place_lupine_pods(
    store: PodStore,
    servers: Iterable[FakeLupine],
    *,
    namespace: str = LUPINE_NAMESPACE,
    labels: Mapping[str, str] = LUPINE_LABELS,
) -> list[Manifest]:
    """Create ``namespace`` (labelled as the component's, unless it exists) and a lupine pod
    per server; returns the pods as stored."""
    if not any(n["metadata"]["name"] == namespace for n in store.list("namespaces")):
        meta = {"name": namespace, "labels": {"rgpu.io/webhook": "ignore"}}
        store.create("namespaces", {"metadata": meta})
    return [
        dict(store.create("pods", lupine_pod(s, index=i, namespace=namespace, labels=labels)))
        for i, s in enumerate(servers)
    ]
