"""What the allocator cannot resolve on its own (a repair that would
double-book) must reach the people who can, where they look: ``kubectl describe pod``. The
runtime's ``EventRecorder`` writes them without ever holding up the repair.
"""

from __future__ import annotations

from rgpu_contracts import PodRef
from rgpu_runtime import KubeEvent, ObjectRef

__all__ = ["COMPONENT", "pod_event"]

COMPONENT = "rgpu-allocator"


def pod_event(pod: PodRef, *, reason: str, message: str, warning: bool = True) -> KubeEvent:
    """An Event about ``pod``."""
    regarding = ObjectRef(kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid)
    return KubeEvent(regarding=regarding, reason=reason, message=message, warning=warning)
