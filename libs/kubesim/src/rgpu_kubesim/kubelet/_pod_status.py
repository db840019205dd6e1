"""The pod status a real kubelet writes, for the emulated one.

Tools read readiness and addresses from the status alone: kubectl's READY column counts
``containerStatuses[].ready``, ``-o wide`` prints ``status.podIP``, and controllers wait on the
``Ready`` condition. A kubelet that only set ``phase`` would show every running pod as 0/1 with
no IP, so the emulator writes the same fields a kubelet does: addresses, the five conditions,
and one status per container, running or terminated with an exit code.
"""

from __future__ import annotations

import hashlib
import time
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


def _condition(kind: str, ok: bool, now: str, reason: str = "", message: str = "") -> JsonObj:
    # reason and message are always sent: written as a strategic merge patch, a null removes
    # what an earlier status left in the element (a kubelet's computed patch does the same).
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "lastProbeTime": None,
        "lastTransitionTime": now,
        "reason": reason or None,
        "message": message or None,
    }


def gate_problems(pod: Mapping[str, Any]) -> list[str]:
    """kubelet's words for each readiness gate whose condition is missing or not True."""
    conditions = {str(c.get("type")): c for c in (pod.get("status") or {}).get("conditions") or ()}
    problems = []
    for gate in (pod.get("spec") or {}).get("readinessGates") or ():
        kind = str(gate.get("conditionType", ""))
        found = conditions.get(kind)
        if found is None:
            why = f'corresponding condition of pod readiness gate "{kind}" does not exist.'
            problems.append(why)
        elif found.get("status") != "True":
            why = f'the status of pod readiness gate "{kind}" is not "True", but {found["status"]}'
            problems.append(why)
    return problems


def ready_condition(pod: Mapping[str, Any], now: str, unready: str = "") -> JsonObj:
    """Ready as the kubelet computes it: every container ready (``unready`` says why not)
    AND every readiness gate's condition True (``ReadinessGatesNotReady`` otherwise)."""
    if unready:
        return _condition("Ready", False, now, unready)
    problems = gate_problems(pod)
    if problems:
        return _condition("Ready", False, now, "ReadinessGatesNotReady", ", ".join(problems))
    return _condition("Ready", True, now)


def same_readiness(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Whether two Ready conditions say the same (times aside)."""
    return a is not None and all(
        (a.get(k) or None) == (b.get(k) or None) for k in ("status", "reason", "message")
    )


def _conditions(pod: Mapping[str, Any], now: str, ready: bool, reason: str) -> list[JsonObj]:
    scheduled = [
        c for c in (pod.get("status") or {}).get("conditions") or () if c["type"] == "PodScheduled"
    ]
    return [
        _condition("PodReadyToStartContainers", True, now),
        _condition("Initialized", True, now),
        ready_condition(pod, now, "" if ready else reason),
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


def unavailable(pod: Mapping[str, Any], where: Placement, message: str, now: str) -> JsonObj:
    """The status of a pod whose GPU containers could not reach their server (exit 1)."""
    end = Exit(
        phase="Failed",
        exit_code=1,
        reason="Error",
        finished_at=now,
        message=message,
        pod_reason="RemoteGPUUnavailable",
    )
    return terminated(pod, where, end)


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


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def exited(code: int) -> Exit:
    """How containers ended: completed (0), or killed by the kubelet (137, SIGKILL's code)."""
    if code == 0:
        return Exit(phase="Succeeded", exit_code=0, reason="Completed", finished_at=now_rfc3339())
    return Exit(phase="Failed", exit_code=code, reason="Error", finished_at=now_rfc3339())
