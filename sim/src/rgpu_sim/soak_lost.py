"""The soak's "server lost under its holder": the allocators run with a short grace, and with
``RGPU_ON_SERVER_LOST=evict`` the workload's owner plays its pods' controller, creating an
evicted pod again (once, named ``<pod>-again``) as a Job would — so the verdict can check that
every holder was told and, evicted, ran again elsewhere (``verdict.check_lost_holders``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import anyio

from .soak_evidence import Evidence, PodLife
from .soak_faults import LOST_GRACE_SECONDS, FaultLog, FaultWindow
from .soak_workload import SoakPod
from .stack import StackOptions

__all__ = ["REPLACEMENT_SUFFIX", "lost_at", "replace_evicted", "replacements", "with_lost_policy"]

REPLACEMENT_SUFFIX = "-again"
SETTLE_SECONDS = 2.0
"""An eviction lands a moment after the fault window it answers may have closed."""


def with_lost_policy(stack: StackOptions, on_server_lost: str) -> StackOptions:
    """``stack`` with its allocators told how long a server may be lost and what to do then."""
    allocator = {
        **stack.extra_env.get("allocator", {}),
        "RGPU_SERVER_LOST_GRACE_SECONDS": f"{LOST_GRACE_SECONDS:g}",
        "RGPU_ON_SERVER_LOST": on_server_lost,
    }
    return dataclasses.replace(stack, extra_env={**stack.extra_env, "allocator": allocator})


def lost_at(windows: Sequence[FaultWindow], life: PodLife) -> bool:
    """Whether ``life`` began to be deleted while its server was lost (the allocator evicted
    it, or the workload deleted it then)."""
    at = life.deleting_at
    return at is not None and any(
        w.kind == "server-lost"
        and w.target == life.server
        and w.start <= at <= (w.end or float("inf")) + SETTLE_SECONDS
        for w in windows
    )


async def replace_evicted(
    run_pod: Callable[[SoakPod], Coroutine[Any, Any, None]],
    asked: Mapping[str, float],
    evidence: Evidence,
    plans: tuple[SoakPod, ...],
    log: FaultLog,
) -> None:
    """Create again, once, every planned pod deleted from a lost server that the workload did
    not delete itself (``asked``); runs until cancelled."""
    by_key = {pod.key: pod for pod in plans}
    replaced: set[str] = set()
    async with anyio.create_task_group() as tg:
        while True:
            await anyio.sleep(0.5)
            for life in list(evidence.pods.values()):
                pod = by_key.get(life.key)
                if pod is None or life.key in replaced or life.key in asked:
                    continue
                if lost_at(log.windows, life):
                    replaced.add(life.key)
                    again = dataclasses.replace(pod, name=pod.name + REPLACEMENT_SUFFIX, fate="run")
                    tg.start_soon(run_pod, again)


def replacements(evidence: Evidence) -> dict[str, PodLife]:
    """Each replaced pod's key → the pod that replaced it."""
    return {
        life.key.removesuffix(REPLACEMENT_SUFFIX): life
        for life in evidence.pods.values()
        if life.key.endswith(REPLACEMENT_SUFFIX)
    }
