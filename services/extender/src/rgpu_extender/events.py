"""``kubectl describe pod`` is where users look first, so the extender
explains its decisions there as Events — but kube-scheduler retries an unschedulable pod for as
long as it stays pending, and a slow apiserver must never slow a verb. So events are
deduplicated per pod and outcome, rate-limited, queued without blocking, and written by one
background task that drops what it cannot write.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts import PodRef
from rgpu_runtime import KubeError

from .apiserver import Apiserver
from .metrics import ExtenderMetrics

__all__ = ["ALLOCATED", "BIND_FAILED", "UNAVAILABLE", "EventRecorder", "PodEvent"]

logger = logging.getLogger(__name__)

ALLOCATED = "RemoteGPUAllocated"
UNAVAILABLE = "RemoteGPUUnavailable"
BIND_FAILED = "RemoteGPUBindFailed"

MESSAGE_LIMIT = 1024
"""Characters of an event message kept; the apiserver caps messages near this anyway."""

WRITE_TIMEOUT = 5.0
"""Seconds one event write may take before it is dropped."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodEvent:
    """One explanation for one pod: ``reason`` is the outcome, ``message`` its detail."""

    pod: PodRef
    reason: str
    message: str
    warning: bool = False


@dataclass(slots=True)
class _Bucket:
    """A token bucket: ``rate`` events per second, bursts of up to ``burst``."""

    rate: float
    burst: float
    tokens: float
    stamp: float

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class EventRecorder:
    """Queue pod events without blocking; ``run`` writes them to the apiserver."""

    def __init__(
        self,
        *,
        component: str,
        metrics: ExtenderMetrics,
        capacity: int = 256,
        rate: float = 10.0,
        burst: int = 25,
        remembered: int = 4096,
    ) -> None:
        self._component = component
        self._metrics = metrics
        self._send, self._receive = anyio.create_memory_object_stream[PodEvent](capacity)
        self._bucket = _Bucket(rate=rate, burst=burst, tokens=burst, stamp=time.monotonic())
        self._seen: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._remembered = remembered

    def record(self, event: PodEvent) -> None:
        """Queue ``event`` unless it repeats the pod's last one for that reason; never blocks."""
        if not event.pod.name or self._repeats(event):
            self._count(event, "deduplicated")
            return
        if not self._bucket.take(time.monotonic()):
            self._forget(event)
            self._count(event, "rate_limited")
            return
        try:
            self._send.send_nowait(event)
        except (anyio.WouldBlock, anyio.ClosedResourceError):
            self._forget(event)
            self._count(event, "dropped")

    def _forget(self, event: PodEvent) -> None:
        # A lost event must not count as told, or the pod's next retry would stay silent.
        self._seen.pop((event.pod.uid, event.reason), None)

    def _repeats(self, event: PodEvent) -> bool:
        key = (event.pod.uid, event.reason)
        if self._seen.get(key) == event.message:
            self._seen.move_to_end(key)
            return True
        self._seen[key] = event.message
        self._seen.move_to_end(key)
        while len(self._seen) > self._remembered:
            self._seen.popitem(last=False)
        return False

    def _count(self, event: PodEvent, result: str) -> None:
        self._metrics.events.labels(event.reason, result).inc()

    async def run(self, apiserver: Apiserver, *, task_status: TaskStatus[None]) -> None:
        """Write queued events until cancelled (started by the lifespan's task group)."""
        task_status.started()
        try:
            async for event in self._receive:
                await self._write(apiserver, event)
        finally:
            self.close()

    def close(self) -> None:
        """Stop accepting events (later ones count as dropped) and free the queue."""
        self._send.close()
        self._receive.close()

    async def _write(self, apiserver: Apiserver, event: PodEvent) -> None:
        body = event_body(event, self._component)
        try:
            with anyio.fail_after(WRITE_TIMEOUT):
                await apiserver.create_event(event.pod.namespace, body, timeout=WRITE_TIMEOUT)
        except (KubeError, TimeoutError) as exc:
            logger.info("event %s for pod %s not written: %s", event.reason, event.pod.key, exc)
            self._count(event, "failed")
            return
        self._count(event, "written")


def event_body(event: PodEvent, component: str) -> dict[str, Any]:
    """The core/v1 Event for ``event``, as kube-scheduler itself would write it."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod = event.pod
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod.name}.{time.time_ns():x}", "namespace": pod.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
        },
        "reason": event.reason,
        "message": event.message[:MESSAGE_LIMIT],
        "type": "Warning" if event.warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
