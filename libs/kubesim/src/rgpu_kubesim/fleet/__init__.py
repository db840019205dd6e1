"""A believable cluster from a seed: GPU servers and client nodes labelled as HAMi writes
them, their fake lupine servers, and a workload of pods to run on them.
"""

from __future__ import annotations

from rgpu_kubesim.fleet._planning import (
    ANNOTATION_RUN_SECONDS,
    DEFAULT_MODELS,
    CardPlan,
    ClientPlan,
    ContainerPlan,
    FleetPlan,
    FleetSpec,
    GpuModel,
    NodeStore,
    Placement,
    PodPlan,
    SeededFleet,
    ServerPlan,
    WorkloadSpec,
    plan_fleet,
    plan_workload,
    seed_fleet,
)

__all__ = [
    "ANNOTATION_RUN_SECONDS",
    "DEFAULT_MODELS",
    "CardPlan",
    "ClientPlan",
    "ContainerPlan",
    "FleetPlan",
    "FleetSpec",
    "GpuModel",
    "NodeStore",
    "Placement",
    "PodPlan",
    "SeededFleet",
    "ServerPlan",
    "WorkloadSpec",
    "plan_fleet",
    "plan_workload",
    "seed_fleet",
]
