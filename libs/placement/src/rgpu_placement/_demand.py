"""A pod's ask is several containers with different lifecycles, and the
two granularities read it differently; this module derives both readings once per request.

``server`` granularity checks every requesting container on its own (count and memory), never
a collapsed synthetic request. ``card`` granularity needs Kubernetes' effective count,
``max(max(init), sum(app) + sum(sidecars))``, each card meeting the largest memory request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rgpu_contracts import ContainerKind, ContainerRequest

__all__ = ["Ask", "Demand", "demand_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """One requesting container's need: ``count`` cards of at least ``memory_mib`` each."""

    count: int
    memory_mib: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """The pod's request, read both ways."""

    containers: tuple[ContainerRequest, ...]
    """Every container in pod order (init first), requesting or not; the codec needs them all."""
    asks: tuple[Ask, ...]
    """Distinct needs of requesting containers, hardest first (server granularity)."""
    effective_count: int
    """Cards the pod needs at once (card granularity)."""
    max_memory_mib: int
    """The largest per-card memory any container asks for (card granularity)."""
    cuda_major: int | None = None
    """The CUDA major the pod's client shim was built for; ``None`` takes any server."""

    def shape(self, granularity: str) -> tuple[object, ...]:
        """All that placing the demand in ``granularity`` reads (not which container gets
        which card): two demands of one shape fit the same servers and are refused for the
        same reasons, so a long queue of differently made pods decides few shapes."""
        if granularity == "card":
            return ("card", self.effective_count, self.max_memory_mib, self.cuda_major)
        return ("server", self.asks, self.effective_count, self.max_memory_mib, self.cuda_major)


def _effective_count(containers: Sequence[ContainerRequest]) -> int:
    init = max((c.count for c in containers if c.kind is ContainerKind.INIT), default=0)
    running = sum(c.count for c in containers if c.kind is not ContainerKind.INIT)
    return max(init, running)


def demand_of(containers: Sequence[ContainerRequest], *, cuda_major: int | None = None) -> Demand:
    """Read a pod's containers (pod order) into a ``Demand``; ``cuda_major`` is the CUDA
    major version it asks for (``None``: any)."""
    asking = [c for c in containers if c.count > 0]
    asks = {Ask(count=c.count, memory_mib=c.memory_mib) for c in asking}
    return Demand(
        containers=tuple(containers),
        asks=tuple(sorted(asks, key=lambda a: (-a.memory_mib, -a.count))),
        effective_count=_effective_count(containers),
        max_memory_mib=max((c.memory_mib for c in asking), default=0),
        cuda_major=cuda_major,
    )
