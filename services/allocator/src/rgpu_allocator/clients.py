"""Everything the allocator says to its peers goes through here, bounded in time and failing
with our own error family, never a library exception.

The apiserver is asked about exactly five things — its claim Leases, Pods, pod annotations
(the wake-up nudge), evictions (preemption, through the Eviction API so PodDisruptionBudgets
are honoured) and Events (what the allocator cannot resolve on its own, such as a repair
that would double-book, must reach ``kubectl describe pod``). Everything works on plain dicts
(``call_raw``): decoding 100,000 pods into kubernetes_asyncio models would cost seconds and
gigabytes. Pods are listed page by page and handed over one page at a time so a full relist
never holds the whole cluster in memory.

With server policies on, the calls in the lupine servers' namespace are ``lupine_pods``'s.

Discovery is asked to probe one lupine server now (``POST /v1/servers/{name}/probe``) before a
pod is refused for busy cards; a slow or absent discovery surfaces as ``DiscoveryUnavailable``.
(The fleet and the topology are followed by long-poll: ``rgpu_runtime.feeds.DiscoveryMirror``.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx
from kubernetes_asyncio.client import PolicyV1Api

from rgpu_contracts import PodRef, Server
from rgpu_runtime.errors import KubeError, KubeNotFound, Unavailable, UpstreamError
from rgpu_runtime.kube import (
    EventRecorder,
    KubeClient,
    KubeEvent,
    Listing,
    ObjectRef,
    WatchEvent,
    kube_pages,
)
from rgpu_runtime.peers import request_json

from .errors import DiscoveryUnavailable, EvictionRefused

__all__ = ["CALL_TIMEOUT", "COMPONENT", "DiscoveryClient", "KubeApi", "pod_event"]

COMPONENT = "rgpu-allocator"
"""The Events' reporting component."""

CALL_TIMEOUT = 3.0
"""Seconds for one read or write on the decision path: kube-scheduler gives the extender 5 s
for a whole filter, which must also cover the decision and two loopback hops."""

TOO_MANY_REQUESTS = 429
"""The Eviction API's answer when a PodDisruptionBudget forbids the eviction now, and also an
apiserver's when it sheds load (with ``Retry-After``)."""

BUDGET_CAUSE = "DisruptionBudget"
"""The cause a budget's refusal carries in ``Status.details.causes``: a shed ``429`` is the
apiserver being busy, which says nothing about whether the victim may go."""

QUEUES_CONFIG = "rgpu-queues"
"""The ConfigMap (in our namespace) holding the queue configuration."""

POD_PAGE_SIZE = 500
"""Pods per list page; the apiserver's own default chunk size for informers."""


class KubeApi:
    """The allocator's apiserver calls, on plain dicts, each bounded by ``CALL_TIMEOUT``.

    Leases are those in ``namespace`` matching ``lease_selector`` (the claim Leases); Events
    go to ``events``, whose writer the lifespan runs.
    """

    __slots__ = ("_events", "_kube", "_policy", "_selector", "namespace")

    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        lease_selector: str,
        events: EventRecorder,
    ) -> None:
        self._kube = kube
        self._policy = PolicyV1Api(kube.api_client)
        self._selector = lease_selector
        self._events = events
        self.namespace = namespace

    async def get_lease(self, name: str) -> dict[str, Any] | None:
        """The Lease ``name`` in our namespace, or ``None`` when it does not exist."""
        api = self._kube.coordination
        try:
            return await self._kube.call_raw(
                api.read_namespaced_lease, name, self.namespace, request_timeout=CALL_TIMEOUT
            )
        except KubeNotFound:
            return None

    async def create_lease(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a Lease; raises ``KubeConflict`` when another writer created it first."""
        api = self._kube.coordination
        return await self._kube.call_raw(
            api.create_namespaced_lease, self.namespace, dict(body), request_timeout=CALL_TIMEOUT
        )

    async def replace_lease(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Compare-and-swap a Lease on the ``resourceVersion`` in ``body``.

        Raises ``KubeConflict`` when someone wrote it since, ``KubeNotFound`` when deleted.
        """
        api = self._kube.coordination
        return await self._kube.call_raw(
            api.replace_namespaced_lease,
            name,
            self.namespace,
            dict(body),
            request_timeout=CALL_TIMEOUT,
        )

    async def list_leases(self) -> Listing:
        """Every claim Lease (ours by label) with the list's resourceVersion."""
        api = self._kube.coordination
        return await self._kube.list_objects(
            api.list_namespaced_lease, self.namespace, label_selector=self._selector
        )

    def watch_leases(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Claim Lease events from ``resource_version`` on; raises ``KubeExpired`` on 410."""
        api = self._kube.coordination
        return self._kube.watch(
            api.list_namespaced_lease,
            self.namespace,
            resource_version=resource_version,
            label_selector=self._selector,
        )

    def queue_config_pages(self) -> AsyncIterator[Listing]:
        """The ``rgpu-queues`` ConfigMap of our namespace, as a list (one page)."""
        fn = self._kube.core.list_namespaced_config_map
        return kube_pages(
            self._kube, fn, self.namespace, field_selector=f"metadata.name={QUEUES_CONFIG}"
        )

    def watch_queue_config(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Changes of the ``rgpu-queues`` ConfigMap from ``resource_version`` on."""
        fn = self._kube.core.list_namespaced_config_map
        return self._kube.watch(
            fn,
            self.namespace,
            resource_version=resource_version,
            field_selector=f"metadata.name={QUEUES_CONFIG}",
        )

    def pod_pages(self) -> AsyncIterator[Listing]:
        """Every pod in every namespace, one page at a time (the last carries the version)."""
        fn = self._kube.core.list_pod_for_all_namespaces
        return kube_pages(self._kube, fn, page_size=POD_PAGE_SIZE)

    def lease_pages(self) -> AsyncIterator[Listing]:
        """Every claim Lease, one page at a time (the last carries the version)."""
        api = self._kube.coordination
        return kube_pages(
            self._kube, api.list_namespaced_lease, self.namespace, label_selector=self._selector
        )

    def watch_pods(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Pod events in every namespace from ``resource_version`` on."""
        fn = self._kube.core.list_pod_for_all_namespaces
        return self._kube.watch(fn, resource_version=resource_version)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the apiserver has it now, or ``None`` when it does not exist."""
        fn = self._kube.core.read_namespaced_pod
        try:
            return await self._kube.call_raw(fn, name, namespace, request_timeout=CALL_TIMEOUT)
        except KubeNotFound:
            return None

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        """The namespace as the apiserver has it now, or ``None`` when it does not exist."""
        fn = self._kube.core.read_namespace
        try:
            return await self._kube.call_raw(fn, name, request_timeout=CALL_TIMEOUT)
        except KubeNotFound:
            return None

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into the pod's; raises ``KubeNotFound`` when it is gone."""
        fn = self._kube.core.patch_namespaced_pod
        body = {"metadata": {"annotations": dict(annotations)}}
        await self._kube.call_raw(fn, name, namespace, body, request_timeout=CALL_TIMEOUT)

    async def lift_gate(
        self,
        namespace: str,
        name: str,
        *,
        resource_version: str,
        gates: list[dict[str, str]],
        annotations: Mapping[str, str],
    ) -> None:
        """Set the pod's scheduling gates to ``gates`` (rgpu's removed) and add
        ``annotations``, if the pod is still at ``resource_version``; a JSON merge patch,
        because a strategic merge patch merges gate lists by name and could never remove one.
        Raises ``KubeConflict`` when the pod changed since, ``KubeNotFound`` when it is gone."""
        fn = self._kube.core.patch_namespaced_pod
        body = {
            "metadata": {"resourceVersion": resource_version, "annotations": dict(annotations)},
            "spec": {"schedulingGates": gates},
        }
        await self._kube.call_raw(
            fn,
            name,
            namespace,
            body,
            request_timeout=CALL_TIMEOUT,
            _content_type="application/merge-patch+json",
        )

    async def evict_pod(self, namespace: str, name: str, *, dry_run: bool = False) -> bool:
        """Ask the Eviction API (policy/v1) to evict the pod; ``False`` when it is already gone.

        ``dry_run`` asks whether the eviction would be allowed now without evicting (nor
        spending any budget). Raises ``EvictionRefused`` when a PodDisruptionBudget forbids it
        now (429 with the ``DisruptionBudget`` cause) and ``KubeError`` for anything else (a
        ``429`` without that cause is ``KubeUnavailable``: the apiserver shed the call).
        """
        fn = self._kube.core.create_namespaced_pod_eviction
        body: dict[str, object] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if dry_run:
            body["deleteOptions"] = {"dryRun": ["All"]}
        try:
            await self._kube.call_raw(fn, name, namespace, body, request_timeout=CALL_TIMEOUT)
        except KubeNotFound:
            return False
        except KubeError as exc:
            if exc.kube_status == TOO_MANY_REQUESTS and BUDGET_CAUSE in exc.kube_causes:
                raise EvictionRefused(f"evicting {namespace}/{name}: {exc.kube_message}") from exc
            raise
        return True

    async def list_budgets(self, namespace: str) -> tuple[dict[str, Any], ...]:
        """The PodDisruptionBudgets of ``namespace`` (policy/v1), status included."""
        fn = self._policy.list_namespaced_pod_disruption_budget
        listing = await self._kube.list_objects(fn, namespace, request_timeout=CALL_TIMEOUT)
        return listing.items

    def record_event(self, event: KubeEvent) -> None:
        """Queue a core/v1 Event; never blocks or raises (see ``EventRecorder``)."""
        self._events.record(event)


def pod_event(pod: PodRef, *, reason: str, message: str, warning: bool = True) -> KubeEvent:
    """An Event about ``pod``."""
    regarding = ObjectRef(kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid)
    return KubeEvent(regarding=regarding, reason=reason, message=message, warning=warning)


NOTHING_TO_PROBE = frozenset({404, 409})
"""Discovery's answers for a server it cannot probe: unknown name, or no endpoint."""


class DiscoveryClient:
    """Asks discovery for on-demand probes over an ``httpx.AsyncClient``."""

    __slots__ = ("_http",)

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def probe(self, server: str, timeout: float) -> Server | None:
        """``server``'s state after discovery probed its lupine now (or a moment ago).

        ``None`` when discovery has nothing to probe (unknown server, no endpoint). Raises
        ``DiscoveryUnavailable`` when discovery cannot be reached within ``timeout``, is not
        ready, or answers something that is not a ``Server``.
        """
        path = f"/v1/servers/{quote(server, safe='')}/probe"
        try:
            return await request_json(
                self._http, "POST", path, decode=Server.from_dict, timeout=timeout
            )
        except UpstreamError as exc:
            if exc.peer_status in NOTHING_TO_PROBE:
                return None
            raise DiscoveryUnavailable(f"discovery {path}: {exc.message}") from exc
        except Unavailable as exc:
            raise DiscoveryUnavailable(f"discovery {path}: {exc.message}") from exc
