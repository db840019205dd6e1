"""A pod whose remote GPU server is lost must be told where its owner and its Service look: a
Warning Event on the pod, and — when the pod declares the readiness gate
``rgpu.io/remote-gpu-ready`` — that condition in its status, which Kubernetes folds into the
pod's Ready, so Endpoints stop sending it traffic. Optionally the pod is evicted (the Eviction
API, so PodDisruptionBudgets decide).

This is the whole of what ``lost`` says to the apiserver, as a narrow protocol: the condition
goes through ``pods/status`` with a strategic merge patch keyed on the condition's ``type``, so
the kubelet's own conditions are never touched; the eviction and the Events reuse ``KubeApi``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

from rgpu_contracts import READINESS_GATE, PodRef
from rgpu_runtime.errors import KubeNotFound
from rgpu_runtime.kube import KubeClient, KubeEvent

from .clients import CALL_TIMEOUT, KubeApi

__all__ = ["GateApi", "KubeGates", "gate_condition"]


class GateApi(Protocol):
    """What the lost-server watch needs from the apiserver."""

    async def set_gate(self, pod: PodRef, ready: bool, reason: str, message: str) -> bool:
        """Write the readiness gate condition; ``False`` when the pod is gone."""

    async def evict(self, pod: PodRef) -> bool:
        """Evict through the Eviction API; ``False`` when the pod is gone. Raises
        ``EvictionRefused`` when a PodDisruptionBudget forbids it now, ``KubeError`` else."""

    def record_event(self, event: KubeEvent) -> None:
        """Queue an Event (never blocks or raises)."""


def gate_condition(ready: bool, reason: str, message: str, now: datetime) -> dict[str, str]:
    """The ``rgpu.io/remote-gpu-ready`` condition as it goes into ``status.conditions``."""
    return {
        "type": READINESS_GATE,
        "status": "True" if ready else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


class KubeGates:
    """``GateApi`` over the allocator's apiserver client."""

    def __init__(self, kube: KubeClient, api: KubeApi) -> None:
        self._kube = kube
        self._api = api

    async def set_gate(self, pod: PodRef, ready: bool, reason: str, message: str) -> bool:
        condition = gate_condition(ready, reason, message, datetime.now(UTC))
        body = {"status": {"conditions": [condition]}}
        fn = self._kube.core.patch_namespaced_pod_status
        try:
            await self._kube.call_raw(
                fn, pod.name, pod.namespace, body, request_timeout=CALL_TIMEOUT
            )
        except KubeNotFound:
            return False
        return True

    async def evict(self, pod: PodRef) -> bool:
        return await self._api.evict_pod(pod.namespace, pod.name)

    def record_event(self, event: KubeEvent) -> None:
        self._api.record_event(event)
