"""The simulated Nodes must look like a kubelet's (addresses, capacity,
conditions, node info) so ``kubectl get nodes`` and every watcher read them like real ones; the
shape is shared by GPU servers and client nodes and kept apart from the fleet's planning logic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

__all__ = [
    "KUBELET_VERSION",
    "LABEL_RACK",
    "LABEL_REGION",
    "LABEL_ZONE",
    "Placement",
    "client_node",
    "server_node",
]

LABEL_RACK: Final = "topology.rgpu.io/rack"
LABEL_ZONE: Final = "topology.kubernetes.io/zone"
LABEL_REGION: Final = "topology.kubernetes.io/region"
KUBELET_VERSION: Final = "v1.32.0-rgpu-sim"


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a node sits: the topology domains rgpu's locality scoring reads."""

    region: str
    zone: str
    rack: str

    def labels(self) -> dict[str, str]:
        """The node labels for these domains."""
        return {LABEL_RACK: self.rack, LABEL_ZONE: self.zone, LABEL_REGION: self.region}


@dataclass(frozen=True, slots=True, kw_only=True)
class _Size:
    cpu: int
    memory_gib: int

    def capacity(self) -> dict[str, str]:
        return {"cpu": str(self.cpu), "memory": f"{self.memory_gib}Gi", "pods": "110"}

    def allocatable(self) -> dict[str, str]:
        # Like a kubelet with system-reserved set: a little less than the machine.
        memory_mib = self.memory_gib * 1024 - 1024
        return {"cpu": f"{self.cpu * 1000 - 500}m", "memory": f"{memory_mib}Mi", "pods": "110"}


_SERVER_SIZE: Final = _Size(cpu=64, memory_gib=1024)
_CLIENT_SIZE: Final = _Size(cpu=32, memory_gib=128)


def server_node(
    *,
    name: str,
    address: str,
    placement: Placement,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    now: datetime,
) -> dict[str, Any]:
    """A GPU server's Node with extra labels (the lupine label) and annotations (register)."""
    node = _node(name=name, address=address, placement=placement, size=_SERVER_SIZE, now=now)
    node["metadata"]["labels"].update(labels)
    node["metadata"]["annotations"] = dict(annotations)
    return node


def client_node(*, name: str, address: str, placement: Placement, now: datetime) -> dict[str, Any]:
    """A client node's Node: no lupine label, no GPUs."""
    return _node(name=name, address=address, placement=placement, size=_CLIENT_SIZE, now=now)


def _node(
    *, name: str, address: str, placement: Placement, size: _Size, now: datetime
) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **placement.labels(),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
            "capacity": size.capacity(),
            "allocatable": size.allocatable(),
            "conditions": _conditions(_timestamp(now)),
            "nodeInfo": _node_info(name),
        },
    }


def _timestamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(stamp: str) -> list[dict[str, str]]:
    quiet = (
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    )
    rows = [(kind, "False", reason) for kind, reason in quiet]
    rows.append(("Ready", "True", "KubeletReady"))
    return [
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": f"simulated kubelet: {reason}",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
        for kind, status, reason in rows
    ]


def _node_info(name: str) -> dict[str, str]:
    return {
        "machineID": f"sim-{name}",
        "systemUUID": f"sim-{name}",
        "bootID": f"sim-{name}",
        "kernelVersion": "6.1.0-sim",
        "osImage": "rgpu kubesim",
        "containerRuntimeVersion": "containerd://1.7.0-sim",
        "kubeletVersion": KUBELET_VERSION,
        "kubeProxyVersion": KUBELET_VERSION,
        "operatingSystem": "linux",
        "architecture": "amd64",
    }
