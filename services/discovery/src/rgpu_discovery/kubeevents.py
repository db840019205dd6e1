"""An operator looks for a broken node in ``kubectl describe node``,
so a register annotation discovery cannot read is reported there, as a Kubernetes Event.

Posting must never slow the Node watch or fail it: events go through a small bounded outbox
that drops (and logs) when the apiserver cannot keep up, and a post that fails is logged
once and forgotten — the problem stays visible in the fleet's ``error`` field anyway.
"""

from __future__ import annotations

import logging
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream
from prometheus_client import Counter

from rgpu_runtime import KubeClient, KubeError

__all__ = ["COMPONENT", "EVENT_NAMESPACE", "EventOutbox", "EventPoster", "NodeEvent"]

logger = logging.getLogger(__name__)

COMPONENT: Final = "rgpu-discovery"
EVENT_NAMESPACE: Final = "default"
"""Nodes are cluster-scoped; the kubelet files their events in ``default``, so do we."""
_MAX_MESSAGE: Final = 1024
_MAX_NAME_PREFIX: Final = 253 - 17
"""Object names are at most 253 characters; the suffix takes 17."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEvent:
    """One Event about Node ``node`` (``uid`` pins it to this incarnation of the node)."""

    node: str
    uid: str
    reason: str
    message: str
    type: str = "Warning"


class EventPoster:
    """Creates core/v1 Events through the Kubernetes API."""

    def __init__(self, kube: KubeClient, *, instance: str | None = None) -> None:
        self._kube = kube
        # In a pod the hostname is the pod's name, which is what reportingInstance means.
        self._instance = instance or socket.gethostname()

    async def post(self, event: NodeEvent) -> None:
        """Create the Event; raises ``KubeError`` when the apiserver refuses or fails."""
        await self._kube.call_raw(
            self._kube.core.create_namespaced_event, EVENT_NAMESPACE, self._body(event)
        )

    def _body(self, event: NodeEvent) -> dict[str, object]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{event.node[:_MAX_NAME_PREFIX]}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": event.node,
                "uid": event.uid,
            },
            "reason": event.reason,
            "message": event.message[:_MAX_MESSAGE],
            "type": event.type,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }


class EventOutbox:
    """A bounded queue of events and the task that posts them.

    The queue exists while ``run`` runs; an event emitted outside that time is dropped.
    """

    def __init__(self, *, posted: Counter, capacity: int = 256) -> None:
        self._posted = posted
        self._capacity = capacity
        self._send: MemoryObjectSendStream[NodeEvent] | None = None

    def emit(self, event: NodeEvent) -> None:
        """Queue ``event`` without waiting; drops it (logged) when the queue is full."""
        try:
            if self._send is None:
                raise anyio.ClosedResourceError
            self._send.send_nowait(event)
        except (anyio.WouldBlock, anyio.ClosedResourceError):
            self._posted.labels("dropped").inc()
            logger.warning(
                "event outbox full or closed; dropped %s event",
                event.reason,
                extra={"node": event.node},
            )

    async def run(
        self, poster: EventPoster, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Post queued events one by one until cancelled."""
        send, receive = anyio.create_memory_object_stream[NodeEvent](self._capacity)
        self._send = send
        try:
            async with send, receive:
                task_status.started()
                async for event in receive:
                    await self._post(poster, event)
        finally:
            self._send = None

    async def _post(self, poster: EventPoster, event: NodeEvent) -> None:
        try:
            await poster.post(event)
        except KubeError as exc:
            self._posted.labels("failed").inc()
            logger.warning(
                "could not record %s event: %s", event.reason, exc, extra={"node": event.node}
            )
        else:
            self._posted.labels("posted").inc()
