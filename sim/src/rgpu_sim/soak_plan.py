"""Everything a soak decides before it starts, without I/O: the fleet it will run on (the same
seeded plan the stack seeds), the pods, paced to the fleet (``soak_sizing``), the queues the
queue workload configures, and whatever would keep the run from finishing — said up front, so
``rgpu soak`` exits 2 with the arithmetic instead of failing checks at its deadline."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rgpu_contracts import card_id
from rgpu_kubesim.fleet import FleetSpec, plan_fleet

from .soak_queues import GANG_SHARE, QUEUE_NAMESPACES, QueueSetup, plan_queues, queue_problems
from .soak_sizing import LOAD, Servers, Sizing, fleet_problems, pace, size
from .soak_workload import SoakPod, WorkloadShape, plan_soak_workload
from .stack import StackOptions

__all__ = ["SoakPlan", "plan_soak"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakPlan:
    """What the soak will do, and why it could not finish (``problems``)."""

    pods: tuple[SoakPod, ...]
    shape: WorkloadShape
    """The workload as paced."""
    sizing: Sizing
    servers: Servers
    """Per server, the memory (MiB) of each healthy card."""
    memory: dict[str, int]
    """Each healthy card's memory (MiB) by card id."""
    queues: QueueSetup | None
    problems: tuple[str, ...] = ()


def _fleet(stack: StackOptions) -> tuple[Servers, dict[str, int]]:
    plan = plan_fleet(
        FleetSpec(
            servers=stack.servers,
            cards=stack.cards,
            clients=stack.clients,
            seed=stack.seed,
            h2only_share=stack.h2only_share,
        )
    )
    servers = [[c.memory_mib for c in s.cards if c.healthy] for s in plan.servers]
    memory: dict[str, int] = {
        card_id(s.name, c.uuid): c.memory_mib for s in plan.servers for c in s.cards if c.healthy
    }
    return servers, memory


def plan_soak(
    stack: StackOptions,
    shape: WorkloadShape,
    *,
    queues: bool,
    load: float = LOAD,
    timeout_seconds: float | None = None,
) -> SoakPlan:
    """The soak's plan. With ``queues``, the workload spreads over the queue namespaces and a
    share of it comes in gangs."""
    if queues:
        shape = replace(shape, namespaces=QUEUE_NAMESPACES, gang_share=GANG_SHARE)
    servers, memory = _fleet(stack)
    granularity = stack.granularity
    shape = pace(shape, servers=servers, granularity=granularity, load=load)
    pods = plan_soak_workload(shape)
    sizing = size(
        pods,
        servers=servers,
        granularity=granularity,
        gap_seconds=shape.mean_gap_seconds,
        timeout_seconds=timeout_seconds,
    )
    setup = plan_queues(pods, servers, granularity) if queues else None
    problems = fleet_problems(pods, servers=servers, granularity=granularity)
    if setup is not None:
        problems += queue_problems(pods, setup, servers, granularity)
    if (late := sizing.problem()) is not None:
        problems.append(late)
    return SoakPlan(
        pods=pods,
        shape=shape,
        sizing=sizing,
        servers=servers,
        memory=memory,
        queues=setup,
        problems=tuple(problems),
    )
