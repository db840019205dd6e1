"""Who goes first when the pool is short is a policy the operator must be able to read in one
place: the order in which gated pods are considered for admission.

Priority first (a pod of higher priority is always considered before one of lower), then
creation time (first come, first served); ``creationTimestamp`` counts whole seconds, so pods
created in the same second go in the order the pod watch delivered them, then by uid (a
total order). The planner's walk (``rgpu_placement.FairWalk``) keeps priority first and
this order within a namespace; between namespaces of equal priority it offers the one with
the fewest cards held per unit of weight first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .pods import PodInfo

__all__ = ["in_order"]


def in_order(pods: Iterable[PodInfo], arrival: Mapping[str, int]) -> list[PodInfo]:
    """``pods`` in the order admission considers them; ``arrival`` numbers pods in the order
    the watch delivered them."""

    def key(pod: PodInfo) -> tuple[int, float, int, str]:
        created = pod.gated.created_at if pod.gated is not None else 0.0
        return -pod.priority, created, arrival.get(pod.uid, 0), pod.uid

    return sorted(pods, key=key)
