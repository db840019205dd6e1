"""``kubectl describe pod`` is where users look first, so the extender
explains its decisions there as Events: the three outcomes it reports, and the recorder that
writes them, wired to the extender's metrics. kube-scheduler retries an unschedulable pod for
as long as it stays pending and a slow apiserver must never slow a verb; the runtime's
``EventRecorder`` deduplicates, rate-limits and queues without blocking.
"""

from __future__ import annotations

from rgpu_contracts import PodRef
from rgpu_runtime.kube import EventRecorder, KubeEvent, ObjectRef
from rgpu_runtime.pacing import TokenBucket

from .instruments import ExtenderMetrics

__all__ = ["ALLOCATED", "BIND_FAILED", "UNAVAILABLE", "event_recorder", "pod_event"]

ALLOCATED = "RemoteGPUAllocated"
UNAVAILABLE = "RemoteGPUUnavailable"
BIND_FAILED = "RemoteGPUBindFailed"


def pod_event(*, pod: PodRef, reason: str, message: str, warning: bool = False) -> KubeEvent:
    """One explanation for one pod: ``reason`` is the outcome, ``message`` its detail."""
    regarding = ObjectRef(kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid)
    return KubeEvent(regarding=regarding, reason=reason, message=message, warning=warning)


def event_recorder(
    *,
    component: str,
    metrics: ExtenderMetrics,
    capacity: int = 256,
    bucket: TokenBucket | None = None,
) -> EventRecorder:
    """A recorder counting each outcome in ``rgpu_extender_events_total{reason,result}``."""

    def counted(event: KubeEvent, outcome: str) -> None:
        metrics.events.labels(event.reason, outcome).inc()

    return EventRecorder(component=component, capacity=capacity, bucket=bucket, on_outcome=counted)
