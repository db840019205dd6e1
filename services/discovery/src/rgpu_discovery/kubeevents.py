"""An operator looks for a broken node in ``kubectl describe node``,
so a register annotation discovery cannot read is reported there, as a Kubernetes Event.

Posting must never slow the Node watch or fail it: the runtime's ``EventRecorder`` queues
without blocking, drops when the apiserver cannot keep up, and logs a failed post once — the
problem stays visible in the fleet's ``error`` field anyway. This module says what a Node
Event is and counts outcomes in discovery's own metric.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Final

from prometheus_client import Counter

from rgpu_runtime import EventRecorder, KubeEvent, ObjectRef

__all__ = ["COMPONENT", "EVENT_NAMESPACE", "NodeEvent", "event_recorder", "node_event"]

COMPONENT: Final = "rgpu-discovery"
EVENT_NAMESPACE: Final = "default"
"""Nodes are cluster-scoped; the kubelet files their events in ``default``, so do we."""

_OUTCOMES: Final = {"written": "posted"}
"""Recorder outcomes under discovery's older metric names; the rest keep theirs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEvent:
    """One Event about Node ``node`` (``uid`` pins it to this incarnation of the node)."""

    node: str
    uid: str
    reason: str
    message: str
    type: str = "Warning"


def node_event(event: NodeEvent) -> KubeEvent:
    """The runtime Event for ``event`` (filed in ``EVENT_NAMESPACE``, as Nodes have none)."""
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
