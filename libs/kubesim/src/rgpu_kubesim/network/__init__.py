"""The simulated pod network as far as NetworkPolicy goes: ``PodNetwork`` decides which
connections reach the fake lupine servers, which run as pods of their own.
"""

from __future__ import annotations

from rgpu_kubesim.network._pod_network import (
    LUPINE_LABELS,
    LUPINE_NAMESPACE,
    PodNetwork,
    PodView,
    Refusal,
    lupine_pod,
    place_lupine_pods,
)

__all__ = [
    "LUPINE_LABELS",
    "LUPINE_NAMESPACE",
    "PodNetwork",
    "PodView",
    "Refusal",
    "lupine_pod",
    "place_lupine_pods",
]
