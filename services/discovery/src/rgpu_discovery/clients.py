"""Discovery's one peer besides lupine is the apiserver: it lists and watches Nodes and files
Events about them. This module is everything discovery says to it, so the rest of the service
sees Node dicts and ``NodeEvent`` values, never the Kubernetes client.

Listing and watching are traced as ``discovery.nodes.list`` and ``discovery.nodes.watch``; the
runtime's ``KubeClient`` already bounds each call and wraps its errors. A watch ends normally by
being closed or cancelled (a relist, a stop), so only an error ends its span as an error.

An operator looks for a broken node in ``kubectl describe node``, so a register annotation
discovery cannot read is reported there, as a Kubernetes Event. Posting must never slow the
Node watch or fail it: the runtime's ``EventRecorder`` queues without blocking, drops when the
apiserver cannot keep up, and logs a failed post once — the problem stays visible in the
fleet's ``error`` field anyway. Nodes are cluster-scoped, so their Events are filed in
``default``, as the kubelet files them.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from typing import Any, Final, cast

from opentelemetry import trace
from prometheus_client import Counter

from rgpu_runtime.kube import (
    EventRecorder,
    KubeClient,
    KubeEvent,
    Listing,
    ObjectRef,
    WatchEvent,
    kube_pages,
)

__all__ = [
    "COMPONENT",
    "NodeApi",
    "NodeEvent",
    "StateLeaseApi",
    "event_recorder",
    "node_event",
]

tracer = trace.get_tracer(__name__)

COMPONENT: Final = "rgpu-discovery"

_OUTCOMES: Final = {"written": "posted"}
"""Recorder outcomes under discovery's older metric names; the rest keep theirs."""


class NodeApi:
    """The Node list and watch, as the runtime's ``Reflector`` consumes them."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def pages(self) -> AsyncIterator[Listing]:
        """Every Node, page by page."""
        with _span("discovery.nodes.list") as span:
            count = 0
            async for page in kube_pages(self._kube, self._kube.core.list_node):
                count += len(page.items)
                yield page
            span.set_attribute("rgpu.nodes", count)

    async def watch(self, version: str) -> AsyncIterator[WatchEvent]:
        """Node changes after resourceVersion ``version``."""
        with _span("discovery.nodes.watch") as span:
            span.set_attribute("rgpu.resource_version", version)
            stream = self._kube.watch(self._kube.core.list_node, resource_version=version)
            # The runtime's watch is an async generator; closing it closes the connection.
            async with aclosing(cast(AsyncGenerator[WatchEvent, None], stream)) as events:
                async for event in events:
                    yield event


@contextmanager
def _span(name: str) -> Iterator[trace.Span]:
    """A span that is not made current and ends as an error only on an ``Exception``.

    Not current: the generators using it yield to the reflector between items, and a context
    attached here must not leak into its code. Closing a generator (``GeneratorExit``) or
    cancelling its task is how a list or watch ends normally, not a failure.
    """
    span = tracer.start_span(name)
    try:
        yield span
    except Exception as exc:
        span.record_exception(exc)
        span.set_status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        span.end()


class StateLeaseApi:
    """The probe-state Leases (``probe_states``) in ``namespace``, chosen by
    ``label_selector``: list, watch and write.

    Every call raises the runtime's ``KubeError`` subclasses (``KubeConflict`` when a
    compare-and-swap lost, ``KubeNotFound`` when the Lease is gone).
    """

    def __init__(self, kube: KubeClient, namespace: str, label_selector: str) -> None:
        self._kube = kube
        self.namespace = namespace
        self._selector = label_selector

    def pages(self) -> AsyncIterator[Listing]:
        """Every state Lease, page by page."""
        api = self._kube.coordination
        return kube_pages(
            self._kube, api.list_namespaced_lease, self.namespace, label_selector=self._selector
        )

    async def watch(self, version: str) -> AsyncIterator[WatchEvent]:
        """State Lease changes after resourceVersion ``version``."""
        api = self._kube.coordination
        stream = self._kube.watch(
            api.list_namespaced_lease,
            self.namespace,
            resource_version=version,
            label_selector=self._selector,
        )
        async with aclosing(cast(AsyncGenerator[WatchEvent, None], stream)) as events:
            async for event in events:
                yield event

    async def read(self, name: str) -> dict[str, Any]:
        """State Lease ``name`` as the apiserver holds it now."""
        api = self._kube.coordination
        return await self._kube.call_raw(api.read_namespaced_lease, name, self.namespace)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a state Lease; ``KubeConflict`` when it already exists."""
        api = self._kube.coordination
        return await self._kube.call_raw(api.create_namespaced_lease, self.namespace, body)

    async def delete(self, name: str, version: str) -> None:
        """Delete state Lease ``name`` if it is still at resourceVersion ``version``."""
        api = self._kube.coordination
        body = {"preconditions": {"resourceVersion": version}}
        await self._kube.call_raw(api.delete_namespaced_lease, name, self.namespace, body=body)

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a state Lease if ``metadata.resourceVersion`` still matches."""
        api = self._kube.coordination
        name = body["metadata"]["name"]
        return await self._kube.call_raw(api.replace_namespaced_lease, name, self.namespace, body)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEvent:
    """One Event about Node ``node`` (``uid`` pins it to this incarnation of the node)."""

    node: str
    uid: str
    reason: str
    message: str
    type: str = "Warning"


def node_event(event: NodeEvent) -> KubeEvent:
    """The runtime Event for ``event`` (the runtime files cluster-scoped ones in ``default``)."""
    regarding = ObjectRef(kind="Node", name=event.node, uid=event.uid)
    return KubeEvent(
        regarding=regarding,
        reason=event.reason,
        message=event.message,
        warning=event.type == "Warning",
    )


def event_recorder(posted: Counter, *, instance: str | None = None) -> EventRecorder:
    """A recorder counting outcomes in ``posted`` (labelled ``outcome``).

    ``instance`` is the ``reportingInstance``; in a pod the hostname is the pod's name,
    which is what that field means.
    """

    def counted(event: KubeEvent, outcome: str) -> None:
        posted.labels(_OUTCOMES.get(outcome, outcome)).inc()

    return EventRecorder(
        component=COMPONENT, instance=instance or socket.gethostname(), on_outcome=counted
    )
