"""``kubectl describe`` is where people look first, so every rgpu service explains itself there
as Kubernetes Events; but a decision path must never wait on, or fail because of, an Event.

``EventRecorder.record`` only decides and enqueues: a repeat of the same object, reason and
message within the dedup window is skipped (kube-scheduler retries a pending pod for as long
as it stays pending, and one Event says it all), a token bucket bounds the write rate, and a
full queue drops. One background task, started by the owning lifespan's task group, writes
what was queued. Every outcome is counted, and reported to ``on_outcome`` for the service's
own metrics. Each Event is written in the trace context it was recorded in, so its apiserver
call shows under the decision it explains rather than as a trace of its own.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import anyio
from anyio.abc import TaskStatus
from opentelemetry import context as otel_context
from opentelemetry.context import Context

from rgpu_runtime.errors import KubeError
from rgpu_runtime.pacing import TokenBucket

from ._client import KubeClient

__all__ = ["EventRecorder", "KubeEvent", "ObjectRef", "event_body"]

logger = logging.getLogger(__name__)

NAME_LIMIT = 253
"""Kubernetes object names are DNS subdomains: at most 253 characters."""
_SUFFIX = 17
"""A dot and 16 hex digits, so names from replicas and retries never collide."""
MESSAGE_LIMIT = 1024
"""Characters of a message kept; the apiserver itself truncates Event messages near this."""
CLUSTER_NAMESPACE = "default"
"""Where Events about cluster-scoped objects (Nodes) go, as the kubelet files them."""

OUTCOMES = ("deduplicated", "dropped", "failed", "invalid", "rate_limited", "written")
"""What can become of a recorded Event."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectRef:
    """The object an Event is about (its ``involvedObject``)."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    def to_dict(self) -> dict[str, str]:
        """The ``involvedObject`` wire shape (``namespace`` and ``uid`` only when set)."""
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeEvent:
    """One Event: ``reason`` is the outcome in CamelCase, ``message`` its detail."""

    regarding: ObjectRef
    reason: str
    message: str
    warning: bool = False

    @property
    def namespace(self) -> str:
        """Where the Event is filed: the object's namespace, or ``default`` for cluster ones."""
        return self.regarding.namespace or CLUSTER_NAMESPACE

    @property
    def dedup_key(self) -> tuple[str, str, str, str, str]:
        """What makes two Events repeats of each other, together with the message."""
        ref = self.regarding
        return (ref.kind, ref.namespace, ref.name, ref.uid, self.reason)


def event_body(
    event: KubeEvent, *, component: str, instance: str = "", now: float | None = None
) -> dict[str, Any]:
    """The core/v1 Event for ``event``, as kube-scheduler itself would write it."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    prefix = event.regarding.name[: NAME_LIMIT - _SUFFIX]
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{prefix}.{secrets.token_hex(8)}", "namespace": event.namespace},
        "involvedObject": event.regarding.to_dict(),
        "reason": event.reason,
        "message": event.message[:MESSAGE_LIMIT],
        "type": "Warning" if event.warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    if instance:
        body["reportingInstance"] = instance
    return body


class EventRecorder:
    """Queues Events without blocking; ``run`` writes them through a ``KubeClient``."""

    def __init__(
        self,
        *,
        component: str,
        instance: str = "",
        capacity: int = 256,
        bucket: TokenBucket | None = None,
        dedup_seconds: float = 600.0,
        remembered: int = 4096,
        write_timeout: float = 5.0,
        on_outcome: Callable[[KubeEvent, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._component = component
        self._instance = instance
        self._bucket = bucket or TokenBucket(10.0, burst=25, clock=clock)
        self._dedup_seconds = dedup_seconds
        self._remembered = remembered
        self._write_timeout = write_timeout
        self._on_outcome = on_outcome
        self._clock = clock
        self._seen: OrderedDict[tuple[str, ...], tuple[str, float]] = OrderedDict()
        self._counts: Counter[str] = Counter()
        self._send, self._receive = anyio.create_memory_object_stream[tuple[KubeEvent, Context]](
            capacity
        )

    @property
    def counts(self) -> Mapping[str, int]:
        """How many Events met each outcome (see ``OUTCOMES``) so far."""
        return MappingProxyType(dict(self._counts))

    def record(self, event: KubeEvent) -> None:
        """Queue ``event`` unless it repeats, exceeds the rate or finds the queue full.

        Never blocks and never raises: an Event is worth less than the caller's work.
        """
        if not event.regarding.name or not event.reason:
            self._count(event, "invalid")
            return
        if self._repeats(event):
            self._count(event, "deduplicated")
            return
        if not self._bucket.take():
            self._forget(event)
            self._count(event, "rate_limited")
            return
        try:
            self._send.send_nowait((event, otel_context.get_current()))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._forget(event)
            self._count(event, "dropped")

    def _repeats(self, event: KubeEvent) -> bool:
        key, now = event.dedup_key, self._clock()
        seen = self._seen.get(key)
        if seen is not None and seen[0] == event.message and now - seen[1] < self._dedup_seconds:
            return True
        self._seen[key] = (event.message, now)
        self._seen.move_to_end(key)
        while len(self._seen) > self._remembered:
            self._seen.popitem(last=False)
        return False

    def _forget(self, event: KubeEvent) -> None:
        # A lost Event must not count as told, or the next retry would stay silent.
        self._seen.pop(event.dedup_key, None)

    def _count(self, event: KubeEvent, outcome: str) -> None:
        self._counts[outcome] += 1
        if self._on_outcome is not None:
            self._on_outcome(event, outcome)

    async def run(
        self, kube: KubeClient, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Write queued Events until cancelled; later ``record`` calls count as dropped."""
        task_status.started()
        try:
            async for event, recorded_in in self._receive:
                token = otel_context.attach(recorded_in)
                try:
                    await self._write(kube, event)
                finally:
                    otel_context.detach(token)
        finally:
            self.close()

    def close(self) -> None:
        """Stop accepting Events and free the queue."""
        self._send.close()
        self._receive.close()

    async def _write(self, kube: KubeClient, event: KubeEvent) -> None:
        body = event_body(event, component=self._component, instance=self._instance)
        create = kube.core.create_namespaced_event
        try:
            with anyio.fail_after(self._write_timeout):
                await kube.call_raw(
                    create, event.namespace, body, request_timeout=self._write_timeout
                )
        except (KubeError, TimeoutError) as exc:
            logger.info(
                "%s event about %s %s not written: %s",
                event.reason,
                event.regarding.kind,
                event.regarding.name,
                exc,
            )
            self._forget(event)
            self._count(event, "failed")
            return
        self._count(event, "written")
