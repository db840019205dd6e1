"""Scheduling behaviour only shows under a stream of pods that ask for
remote GPUs in the ways real users do (one card, several, with memory, in more than one
container), arriving over time and finishing after a while. This plans that stream from a
seed, so a run can be replayed exactly; it writes manifests, it does not submit them.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Final

from rgpu_kubesim._lupine_errors import SimOptionError

__all__ = [
    "ANNOTATION_RUN_SECONDS",
    "ContainerPlan",
    "PodPlan",
    "WorkloadSpec",
    "plan_workload",
]

ANNOTATION_RUN_SECONDS: Final = "sim.rgpu.io/run-seconds"
_RESOURCE: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABELS: Final = {
    "app.kubernetes.io/name": "rgpu-sim-workload",
    "app.kubernetes.io/managed-by": "rgpu-kubesim",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """How many pods, asking for what, arriving how fast; same spec, same pods."""

    pods: int = 20
    seed: int = 0
    namespaces: tuple[str, ...] = ("default",)
    resource_count: str = "nvidia.com/remote-gpu"
    resource_memory: str = "nvidia.com/remote-gpu-memory"
    scheduler_name: str | None = None
    """Unset by default: the admission webhook sets ``schedulerName`` on pods that ask for GPUs."""
    max_cards: int = 2
    """Most cards one container asks for; keep it at or below a server's card count."""
    memory_share: float = 0.5
    """Share of GPU containers that also ask for memory per card."""
    memory_mib_choices: tuple[int, ...] = (8192, 16384, 40960)
    multi_container_share: float = 0.2
    """Share of pods with a second container (which asks for GPUs half the time)."""
    mean_gap_seconds: float = 1.0
    """Mean time between arrivals (exponential gaps, i.e. a Poisson stream)."""
    run_seconds: tuple[float, float] = (5.0, 30.0)
    name_prefix: str = "job-"
    image: str = "registry.local/rgpu/cuda-app:1"

    def __post_init__(self) -> None:
        _whole("pods", self.pods, 0)
        _whole("max_cards", self.max_cards, 1)
        for name in ("memory_share", "multi_container_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise SimOptionError(name, f"must be between 0 and 1, got {getattr(self, name)}")
        self._check_names()
        self._check_times()
        if not self.memory_mib_choices or min(self.memory_mib_choices) < 1:
            raise SimOptionError("memory_mib_choices", "give at least one positive MiB amount")

    def _check_names(self) -> None:
        for field, value in (
            ("resource_count", self.resource_count),
            ("resource_memory", self.resource_memory),
        ):
            if not _RESOURCE.match(value):
                raise SimOptionError(field, f"{value!r} is not a '<domain>/<name>' resource name")
        if not self.namespaces or not all(_DNS_LABEL.match(ns) for ns in self.namespaces):
            raise SimOptionError("namespaces", f"{self.namespaces!r}: give DNS-1123 labels")
        if not _DNS_LABEL.match(f"{self.name_prefix}0"):
            raise SimOptionError("name_prefix", f"{self.name_prefix!r} makes invalid pod names")
        if self.scheduler_name is not None and not self.scheduler_name:
            raise SimOptionError("scheduler_name", "use None to leave it unset, not ''")

    def _check_times(self) -> None:
        if self.mean_gap_seconds < 0:
            raise SimOptionError("mean_gap_seconds", f"must be >= 0, got {self.mean_gap_seconds}")
        low, high = self.run_seconds
        if not 0 < low <= high:
            raise SimOptionError("run_seconds", f"need 0 < min <= max, got {self.run_seconds}")


def _whole(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SimOptionError(name, f"must be a whole number >= {minimum}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerPlan:
    """One container: how many cards it asks for (0 = none) and MiB per card, if any."""

    name: str
    cards: int
    memory_mib: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodPlan:
    """A pod to submit ``arrival_seconds`` after the start; it runs ``run_seconds`` once bound."""

    name: str
    namespace: str
    arrival_seconds: float
    run_seconds: float
    containers: tuple[ContainerPlan, ...]
    spec: WorkloadSpec

    @property
    def total_cards(self) -> int:
        """Cards asked for over all containers."""
        return sum(c.cards for c in self.containers)

    def manifest(self) -> dict[str, Any]:
        """A fresh Pod manifest (callers may mutate it)."""
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [self._container(c) for c in self.containers],
        }
        if self.spec.scheduler_name is not None:
            pod_spec["schedulerName"] = self.spec.scheduler_name
        metadata = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": dict(_LABELS),
            "annotations": {ANNOTATION_RUN_SECONDS: f"{self.run_seconds:g}"},
        }
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}

    def _container(self, container: ContainerPlan) -> dict[str, Any]:
        return {
            "name": container.name,
            "image": self.spec.image,
            "resources": self._resources(container),
        }

    def _resources(self, container: ContainerPlan) -> dict[str, dict[str, str]]:
        if not container.cards:
            return {"requests": {"cpu": "100m", "memory": "64Mi"}}
        asks = {self.spec.resource_count: str(container.cards)}
        if container.memory_mib is not None:
            asks[self.spec.resource_memory] = str(container.memory_mib)
        # Extended resources must have requests equal to limits.
        return {"limits": dict(asks), "requests": dict(asks)}


def plan_workload(spec: WorkloadSpec) -> tuple[PodPlan, ...]:
    """Plan ``spec.pods`` pods in arrival order (no I/O)."""
    rng = random.Random(f"rgpu-workload:{spec.seed}")
    width = max(3, len(str(spec.pods)))
    plans: list[PodPlan] = []
    clock = 0.0
    for i in range(spec.pods):
        clock += rng.expovariate(1 / spec.mean_gap_seconds) if spec.mean_gap_seconds else 0.0
        plans.append(_plan_pod(spec, rng, f"{spec.name_prefix}{i + 1:0{width}d}", clock))
    return tuple(plans)


def _plan_pod(spec: WorkloadSpec, rng: random.Random, name: str, clock: float) -> PodPlan:
    containers = [_gpu_container(spec, rng, "main")]
    if rng.random() < spec.multi_container_share:
        second = _gpu_container(spec, rng, "worker")
        containers.append(second if rng.random() < 0.5 else _sidecar())
    return PodPlan(
        name=name,
        namespace=rng.choice(spec.namespaces),
        arrival_seconds=round(clock, 3),
        run_seconds=round(rng.uniform(*spec.run_seconds), 3),
        containers=tuple(containers),
        spec=spec,
    )


def _gpu_container(spec: WorkloadSpec, rng: random.Random, name: str) -> ContainerPlan:
    cards = rng.randint(1, spec.max_cards)
    memory = rng.choice(spec.memory_mib_choices) if rng.random() < spec.memory_share else None
    return ContainerPlan(name=name, cards=cards, memory_mib=memory)


def _sidecar() -> ContainerPlan:
    return ContainerPlan(name="log-shipper", cards=0, memory_mib=None)
