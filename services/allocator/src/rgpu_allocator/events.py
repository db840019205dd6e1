"""What the allocator cannot resolve on its own (a repair that would
double-book) must reach the people who can, where they look: ``kubectl describe pod``.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from rgpu_contracts import PodRef

__all__ = ["COMPONENT", "pod_event"]

COMPONENT = "rgpu-allocator"


def _stamp(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_event(
    pod: PodRef, *, reason: str, message: str, now: float, warning: bool = True
) -> dict[str, Any]:
    """A core/v1 Event about ``pod`` (name unique per call, as the apiserver requires)."""
    stamp = _stamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod.name}.{secrets.token_hex(8)}", "namespace": pod.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
