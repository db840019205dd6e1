"""With server policies on (``RGPU_SERVER_POLICIES``), the allocator reads and writes in the
lupine servers' namespace, and only there: its lupine pods (listed and watched; each labelled
with its node) and rgpu's NetworkPolicies. ``LupineApi`` is every such call, bounded in time
like the allocator's other apiserver calls; ``LupinePod`` is what a lupine pod is read into.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import NetworkingV1Api

from rgpu_runtime.errors import KubeNotFound
from rgpu_runtime.kube import KubeClient, Listing, WatchEvent, kube_pages

from .claims import MANAGED_BY_SELECTOR
from .clients import CALL_TIMEOUT
from .policy_objects import NODE_LABEL
from .settings import ServerPolicySettings

__all__ = ["LupineApi", "LupinePod", "lupine_api", "read_lupine_pod"]


class LupineApi:
    """The calls of the server-policies mode, confined to the lupine servers' ``namespace``:
    its lupine pods (``labels``, listed and watched; labelled with their node) and our
    NetworkPolicies there (``policy_selector``), each bounded by ``CALL_TIMEOUT``."""

    __slots__ = ("_kube", "_net", "_pods", "_policies", "namespace")

    def __init__(
        self, kube: KubeClient, *, namespace: str, labels: str, policy_selector: str
    ) -> None:
        self._kube = kube
        self._net = NetworkingV1Api(kube.api_client)
        self._pods = labels
        self._policies = policy_selector
        self.namespace = namespace

    def pod_pages(self) -> AsyncIterator[Listing]:
        """The lupine pods, one page at a time."""
        fn = self._kube.core.list_namespaced_pod
        return kube_pages(self._kube, fn, self.namespace, label_selector=self._pods)

    def watch_pods(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        fn = self._kube.core.list_namespaced_pod
        return self._kube.watch(
            fn, self.namespace, resource_version=resource_version, label_selector=self._pods
        )

    async def label_pod(self, name: str, labels: Mapping[str, str]) -> None:
        """Merge ``labels`` into lupine pod ``name``'s; raises ``KubeNotFound`` when gone."""
        fn = self._kube.core.patch_namespaced_pod
        body = {"metadata": {"labels": dict(labels)}}
        await self._kube.call_raw(fn, name, self.namespace, body, request_timeout=CALL_TIMEOUT)

    def policy_pages(self) -> AsyncIterator[Listing]:
        """Our NetworkPolicies, one page at a time."""
        fn = self._net.list_namespaced_network_policy
        return kube_pages(self._kube, fn, self.namespace, label_selector=self._policies)

    def watch_policies(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        fn = self._net.list_namespaced_network_policy
        return self._kube.watch(
            fn, self.namespace, resource_version=resource_version, label_selector=self._policies
        )

    async def create_policy(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Raises ``KubeConflict`` when it exists already (a write we have not seen)."""
        fn = self._net.create_namespaced_network_policy
        return await self._kube.call_raw(
            fn, self.namespace, dict(body), request_timeout=CALL_TIMEOUT
        )

    async def replace_policy(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Compare-and-swap on ``body``'s resourceVersion: ``KubeConflict`` when someone wrote
        it since, ``KubeNotFound`` when it was deleted."""
        fn = self._net.replace_namespaced_network_policy
        return await self._kube.call_raw(
            fn, name, self.namespace, dict(body), request_timeout=CALL_TIMEOUT
        )

    async def delete_policy(self, name: str) -> None:
        """Delete; a policy already gone is no error."""
        fn = self._net.delete_namespaced_network_policy
        try:
            await self._kube.call_raw(fn, name, self.namespace, request_timeout=CALL_TIMEOUT)
        except KubeNotFound:
            return


def lupine_api(kube: KubeClient, settings: ServerPolicySettings) -> LupineApi:
    """The mode's calls, confined to the lupine servers' namespace and our policies."""
    labels = ",".join(f"{key}={value}" for key, value in settings.lupine_labels)
    return LupineApi(
        kube,
        namespace=settings.lupine_namespace,
        labels=labels,
        policy_selector=MANAGED_BY_SELECTOR,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LupinePod:
    """A lupine server pod: where it runs and the node label it carries now."""

    name: str
    node: str
    label: str | None


def read_lupine_pod(raw: Mapping[str, Any]) -> LupinePod | None:
    """A lupine pod as its watch delivers it; ``None`` until it is scheduled to a node."""
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return None
    label = (meta.get("labels") or {}).get(NODE_LABEL)
    return LupinePod(name=str(meta.get("name") or ""), node=node, label=label)
