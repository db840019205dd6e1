"""The soak's pods: a seeded Poisson stream shaped like a real cluster's
GPU jobs — one container or several, init containers that use the GPU before the app does,
memory asks, run times — where some pods are deleted by their owner while they run and some
while they still wait. The same seed plans the same stream, so a failing soak replays.

The priority mix puts urgent pods among batch ones, as a cluster that shares GPUs between
inference and training has them: a share of the pods is ``urgent`` (they may preempt), the rest
``batch``, and some batch pods carry a budget label that a PodDisruptionBudget covers — one
budget allows evictions while enough of its pods are healthy, one forbids every eviction. The
mix is drawn from a random stream of its own, so the pods' shapes stay those of the same seed
without it.

Gangs (``gang_share``) are multi-pod jobs: a run of consecutive pods becomes one gang of two or
three, in one namespace, arriving together, labelled ``rgpu.io/gang`` and ``rgpu.io/gang-size``
so rgpu admits them all or none. Their owner never deletes them (a gang's job ends whole). They
too are drawn from a stream of their own."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from rgpu_kubesim.fleet import ANNOTATION_RUN_SECONDS

__all__ = [
    "BUDGETS",
    "BUDGET_LABEL",
    "GANG_LABEL",
    "GANG_SIZE_LABEL",
    "PRIORITY_CLASSES",
    "SoakPod",
    "WorkloadShape",
    "budget_manifests",
    "plan_soak_workload",
    "priority_class_manifests",
]

Fate = Literal["run", "delete-running", "delete-pending"]

_COUNT = "nvidia.com/remote-gpu"
_MEMORY = "nvidia.com/remote-gpu-memory"
_IMAGE = "registry.local/rgpu/cuda-app:1"
_LABELS = {"app.kubernetes.io/name": "rgpu-soak"}
BUDGET_LABEL = "rgpu.io/soak-budget"
PRIORITY_CLASSES: Mapping[str, int] = {"batch": 10, "urgent": 1000}
BUDGETS: Mapping[str, int | str] = {"spread": 1, "guarded": "100%"}
"""Budget name → ``minAvailable`` over the batch pods labelled with it: ``spread`` allows an
eviction while two of its pods are healthy, ``guarded`` forbids every eviction."""
_GRACE_CHOICES = (1, 2, 5)
GANG_LABEL = "rgpu.io/gang"
GANG_SIZE_LABEL = "rgpu.io/gang-size"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadShape:
    """How the stream looks; shares are per pod."""

    pods: int = 1000
    seed: int = 1
    max_cards: int = 2
    mean_gap_seconds: float = 0.2
    run_seconds: tuple[float, float] = (0.5, 2.5)
    memory_mib_choices: tuple[int, ...] = (8192, 16384, 40960)
    memory_share: float = 0.4
    multi_container_share: float = 0.2
    init_share: float = 0.15
    delete_running_share: float = 0.05
    delete_pending_share: float = 0.05
    namespaces: tuple[str, ...] = ("default", "team-a")
    priority_share: float = 0.0
    """Share of ``urgent`` pods; above 0 the rest are ``batch`` (the priority mix is on)."""
    budget_share: float = 0.3
    """Share of batch pods under a PodDisruptionBudget (with the priority mix on)."""
    gang_share: float = 0.0
    """Share of pods that are members of a gang."""
    gang_sizes: tuple[int, ...] = (2, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakPod:
    """One pod of the stream: when it arrives, what it asks, and what its owner does to it."""

    name: str
    namespace: str
    arrival_seconds: float
    run_seconds: float
    containers: tuple[tuple[str, int, int | None], ...]
    """``(name, cards, MiB per card or None)`` per app container; 0 cards = no GPU."""
    init_cards: int
    """Cards the init container asks for (0 = no init container)."""
    fate: Fate
    delete_after_seconds: float
    """For a deleted pod: seconds after it started running, or after creation when pending."""
    priority_class: str | None = None
    budget: str | None = None
    """The PodDisruptionBudget (``BUDGETS``) whose label the pod carries."""
    grace_seconds: int | None = None
    """``terminationGracePeriodSeconds`` (None: Kubernetes' default of 30)."""
    gang: str | None = None
    """The gang the pod belongs to (``rgpu.io/gang``), in its namespace."""
    gang_size: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def manifest(self) -> dict[str, Any]:
        """A fresh Pod manifest."""
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [_container(*c) for c in self.containers],
        }
        if self.init_cards:
            spec["initContainers"] = [_container("fetch-weights", self.init_cards, None)]
        if self.priority_class:
            spec["priorityClassName"] = self.priority_class
        if self.grace_seconds is not None:
            spec["terminationGracePeriodSeconds"] = self.grace_seconds
        labels = dict(_LABELS) | ({BUDGET_LABEL: self.budget} if self.budget else {})
        if self.gang:
            labels |= {GANG_LABEL: self.gang, GANG_SIZE_LABEL: str(self.gang_size)}
        metadata = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_RUN_SECONDS: f"{self.run_seconds:g}"},
        }
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def priority_class_manifests() -> tuple[dict[str, Any], ...]:
    """The mix's PriorityClasses (``scheduling.k8s.io/v1``)."""
    return tuple(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        for name, value in PRIORITY_CLASSES.items()
    )


def budget_manifests(namespace: str) -> tuple[dict[str, Any], ...]:
    """The mix's PodDisruptionBudgets in ``namespace`` (``policy/v1``)."""
    return tuple(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": f"rgpu-soak-{name}", "namespace": namespace},
            "spec": {
                "minAvailable": floor,
                "selector": {"matchLabels": {BUDGET_LABEL: name}},
            },
        }
        for name, floor in BUDGETS.items()
    )


def _container(name: str, cards: int, memory: int | None) -> dict[str, Any]:
    if not cards:
        resources = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    else:
        asks = {_COUNT: str(cards)} | ({_MEMORY: str(memory)} if memory else {})
        resources = {"limits": dict(asks), "requests": dict(asks)}
    return {"name": name, "image": _IMAGE, "resources": resources}


def plan_soak_workload(shape: WorkloadShape) -> tuple[SoakPod, ...]:
    """Plan ``shape.pods`` pods in arrival order (no I/O)."""
    rng = random.Random(f"rgpu-soak:{shape.seed}")
    mix = random.Random(f"rgpu-soak-priority:{shape.seed}")
    width = max(4, len(str(shape.pods)))
    clock, pods = 0.0, []
    for i in range(shape.pods):
        clock += rng.expovariate(1 / shape.mean_gap_seconds) if shape.mean_gap_seconds else 0.0
        pod = _pod(shape, rng, f"soak-{i + 1:0{width}d}", clock)
        pods.append(_mixed(shape, mix, pod) if shape.priority_share > 0 else pod)
    return tuple(_ganged(shape, pods)) if shape.gang_share > 0 else tuple(pods)


def _ganged(shape: WorkloadShape, pods: list[SoakPod]) -> list[SoakPod]:
    """Runs of consecutive pods made gangs: the first member's namespace, arrival and
    priority for all, never deleted by their owner."""
    rng = random.Random(f"rgpu-soak-gangs:{shape.seed}")
    mean = sum(shape.gang_sizes) / len(shape.gang_sizes)
    found, at = [], 0
    while at < len(pods):
        size = rng.choice(shape.gang_sizes)
        if rng.random() >= shape.gang_share / mean or at + size > len(pods):
            found.append(pods[at])
            at += 1
            continue
        first = pods[at]
        found.extend(
            replace(
                member,
                namespace=first.namespace,
                arrival_seconds=first.arrival_seconds,
                priority_class=first.priority_class,
                budget=None,
                fate="run",
                gang=f"gang-{first.name}",
                gang_size=size,
            )
            for member in pods[at : at + size]
        )
        at += size
    return found


def _mixed(shape: WorkloadShape, mix: random.Random, pod: SoakPod) -> SoakPod:
    """``pod`` as urgent, or as batch with a grace period and perhaps a budget."""
    if mix.random() < shape.priority_share:
        return replace(pod, priority_class="urgent")
    budget = mix.choice(sorted(BUDGETS)) if mix.random() < shape.budget_share else None
    grace = mix.choice(_GRACE_CHOICES)
    return replace(pod, priority_class="batch", budget=budget, grace_seconds=grace)


def _pod(shape: WorkloadShape, rng: random.Random, name: str, clock: float) -> SoakPod:
    containers = [_gpu(shape, rng, "main")]
    if rng.random() < shape.multi_container_share:
        containers.append(_gpu(shape, rng, "worker") if rng.random() < 0.5 else ("logs", 0, None))
    run = round(rng.uniform(*shape.run_seconds), 3)
    fate = _fate(shape, rng.random())
    after = rng.uniform(0.1, run * 0.8) if fate == "delete-running" else rng.uniform(0.0, 1.5)
    return SoakPod(
        name=name,
        namespace=rng.choice(shape.namespaces),
        arrival_seconds=round(clock, 3),
        run_seconds=run,
        containers=tuple(containers),
        init_cards=rng.randint(1, shape.max_cards) if rng.random() < shape.init_share else 0,
        fate=fate,
        delete_after_seconds=round(after, 3),
    )


def _gpu(shape: WorkloadShape, rng: random.Random, name: str) -> tuple[str, int, int | None]:
    memory = rng.choice(shape.memory_mib_choices) if rng.random() < shape.memory_share else None
    return (name, rng.randint(1, shape.max_cards), memory)


def _fate(shape: WorkloadShape, draw: float) -> Fate:
    if draw < shape.delete_running_share:
        return "delete-running"
    if draw < shape.delete_running_share + shape.delete_pending_share:
        return "delete-pending"
    return "run"
