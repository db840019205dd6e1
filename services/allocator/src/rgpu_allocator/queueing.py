"""Who goes first when the pool is short is a policy the operator must be able to read in one
place: the order in which gated pods are considered for admission.

Priority first (a pod of higher priority is always considered before one of lower), then
creation time (first come, first served), then uid (a total order, so every replica lists the
queue the same way).
"""

from __future__ import annotations

from collections.abc import Iterable

from .pods import PodInfo

__all__ = ["in_order", "queue_key"]


def queue_key(pod: PodInfo) -> tuple[int, float, str]:
    """The sort key of ``pod`` in the admission queue (smallest first)."""
    created = pod.gated.created_at if pod.gated is not None else 0.0
    return -pod.priority, created, pod.uid


def in_order(pods: Iterable[PodInfo]) -> list[PodInfo]:
    """``pods`` in the order admission considers them."""
    return sorted(pods, key=queue_key)
