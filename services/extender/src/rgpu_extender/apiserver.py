"""The extender makes two apiserver calls of its own — bind a pod, read
it back when a bind's outcome is unknown — and each must be bounded in time and fail with
runtime's ``KubeError`` family, never a kubernetes_asyncio exception. (Events go through the
runtime's ``EventRecorder``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rgpu_runtime import KubeClient

__all__ = ["Apiserver"]


class Apiserver:
    """The extender's view of the Kubernetes API, over runtime's ``KubeClient``."""

    __slots__ = ("_kube",)

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def bind(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """POST the pod's Binding with ``annotations``; raises ``KubeConflict`` when bound."""
        await self._kube.bind_pod(namespace, name, uid=uid, node=node, annotations=annotations)

    async def read_pod(self, namespace: str, name: str, *, timeout: float) -> dict[str, Any]:
        """The pod as JSON; raises ``KubeNotFound`` when it is gone."""
        core = self._kube.core
        return await self._kube.call_raw(
            core.read_namespaced_pod, name, namespace, request_timeout=timeout
        )
