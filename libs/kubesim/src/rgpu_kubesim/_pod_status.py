"""The pod status a real kubelet writes, for the emulated one.

Tools read readiness and addresses from the status alone: kubectl's READY column counts
``containerStatuses[].ready``, ``-o wide`` prints ``status.podIP``, and controllers wait on the
``Ready`` condition. A kubelet that only set ``phase`` would show every running pod as 0/1 with
no IP, so the emulator writes the same fields a kubelet does: addresses, the five conditions,
and one status per container, running or terminated with an exit code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JsonObj = dict[str, Any]
_RUNTIME = "containerd://"


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where the pod's containers run."""

    host_ip: str
    pod_ip: str
    started_at: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Exit:
    """How the pod's containers ended."""

    phase: str
    """``Succeeded`` or ``Failed``."""
    exit_code: int
    reason: str
    """The container's reason: ``Completed`` or ``Error``."""
    finished_at: str
    message: str = ""
    pod_reason: str = ""
    """The pod's ``status.reason`` (``RemoteGPUUnavailable``), empty for none."""


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _image_id(image: str) -> str:
    repository = image.rpartition("@")[0] or image.rpartition(":")[0] or image
    if "/" not in repository:
        repository = f"docker.io/library/{repository}"
    return f"{repository}@sha256:{_digest(image)}"


def _container(pod: Mapping[str, Any], spec: Mapping[str, Any], state: JsonObj) -> JsonObj:
    running = "running" in state
    image = str(spec.get("image", ""))
    return {
        "name": spec["name"],
        "state": state,
        "lastState": {},
        "ready": running,
        "restartCount": 0,
        "image": image,
        "imageID": _image_id(image),
        "containerID": _RUNTIME + _digest(str(pod["metadata"]["uid"]), str(spec["name"])),
        "started": running,
    }


def _condition(kind: str, ok: bool, now: str, reason: str = "") -> JsonObj:
    condition: JsonObj = {
        "type": kind,
        "status": "True" if ok else "False",
        "lastProbeTime": None,
        "lastTransitionTime": now,
    }
    if reason:
        condition["reason"] = reason
    return condition


def _conditions(pod: Mapping[str, Any], now: str, ready: bool, reason: str) -> list[JsonObj]:
    scheduled = [
        c for c in (pod.get("status") or {}).get("conditions") or () if c["type"] == "PodScheduled"
    ]
    return [
        _condition("PodReadyToStartContainers", True, now),
        _condition("Initialized", True, now),
        _condition("Ready", ready, now, reason),
        _condition("ContainersReady", ready, now, reason),
        *(scheduled or [_condition("PodScheduled", True, now)]),
    ]


def _addresses(where: Placement) -> JsonObj:
    return {
        "hostIP": where.host_ip,
        "hostIPs": [{"ip": where.host_ip}],
        "podIP": where.pod_ip,
        "podIPs": [{"ip": where.pod_ip}],
        "startTime": where.started_at,
    }


def _init_statuses(pod: Mapping[str, Any], where: Placement) -> JsonObj:
    init = (pod.get("spec") or {}).get("initContainers") or ()
    if not init:
        return {}
    done = {"exitCode": 0, "reason": "Completed", "startedAt": where.started_at}
    state = {"terminated": {**done, "finishedAt": where.started_at}}
    return {"initContainerStatuses": [_container(pod, c, state) for c in init]}


def starting(pod: Mapping[str, Any], where: Placement) -> JsonObj:
    """The status once the sandbox has its address and the containers are being created."""
    state = {"waiting": {"reason": "ContainerCreating"}}
    containers = (pod.get("spec") or {}).get("containers") or ()
    return {
        "phase": "Pending",
        "conditions": _conditions(pod, where.started_at, False, "ContainersNotReady"),
        **_addresses(where),
        **_init_statuses(pod, where),
        "containerStatuses": [_container(pod, c, state) for c in containers],
    }


def running(pod: Mapping[str, Any], where: Placement) -> JsonObj:
    """The status once every container has started."""
    state = {"running": {"startedAt": where.started_at}}
    containers = (pod.get("spec") or {}).get("containers") or ()
    return {
        "phase": "Running",
        "conditions": _conditions(pod, where.started_at, True, ""),
        **_addresses(where),
        **_init_statuses(pod, where),
        "containerStatuses": [_container(pod, c, state) for c in containers],
    }


def terminated(pod: Mapping[str, Any], where: Placement, end: Exit) -> JsonObj:
    """The status once every container has exited."""
    ended: JsonObj = {
        "exitCode": end.exit_code,
        "reason": end.reason,
        "startedAt": where.started_at,
        "finishedAt": end.finished_at,
    }
    if end.message:
        ended["message"] = end.message
    containers = (pod.get("spec") or {}).get("containers") or ()
    why = "PodCompleted" if end.phase == "Succeeded" else "PodFailed"
    status: JsonObj = {
        "phase": end.phase,
        "conditions": _conditions(pod, end.finished_at, False, why),
        **_addresses(where),
        **_init_statuses(pod, where),
        "containerStatuses": [_container(pod, c, {"terminated": ended}) for c in containers],
    }
    if end.pod_reason:
        status.update(reason=end.pod_reason, message=end.message)
    return status
