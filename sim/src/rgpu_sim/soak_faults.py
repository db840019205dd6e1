"""What the soak does to the system while it works: the faults a real
cluster throws at rgpu — a flaky, slow apiserver that cuts watches and compacts history, GPU
servers that go away (one of them, now and then, for long enough that its holders are told:
"server lost under its holder"), get busy with clients rgpu did not place or run old h2-only
lupine builds, Nodes turning NotReady, Bindings failing, and service replicas killed outright
and restarted as a Deployment would. Every fault is drawn from the seed and written to a log
with its window, so the verdict can tell an injected failure from a real one."""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from .stack import REPLICATED, Stack

__all__ = [
    "LOST_DEADLINE_SECONDS",
    "LOST_GRACE_SECONDS",
    "FaultLog",
    "FaultWindow",
    "apply_standing_faults",
    "held_servers",
    "run_faults",
]

API_ERROR_RATE = 0.05
"""Share of apiserver requests answered 429 with ``Retry-After``."""
API_LATENCY_SECONDS = 0.003
KILL_EVERY_SECONDS = 20.0
BINDING_ERROR_RATE = 0.3
COMPACTION_LAG_SECONDS = 2.0
LOST_GRACE_SECONDS = 2.0
"""The soak's ``RGPU_SERVER_LOST_GRACE_SECONDS``: short, so a lost server's holders are told
within the window."""
LOST_DEADLINE_SECONDS = LOST_GRACE_SECONDS + 6.0
"""By when, after a held server went down, its holders must have been told: two failed probes
(1 s apart, 1 s timeout), the fleet reaching the allocator, its next look, then the grace, with
room for a loaded machine."""
LOST_HOLD_SECONDS = LOST_DEADLINE_SECONDS + 2.0
"""How long the lost server stays down."""
CLAIM_LEASES = "app.kubernetes.io/managed-by=rgpu"


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultWindow:
    """One injected fault: what, on which target, from when until when (monotonic)."""

    kind: str
    target: str
    start: float
    end: float | None = None


@dataclass(slots=True)
class FaultLog:
    """Every fault injected, in order."""

    windows: list[FaultWindow] = field(default_factory=list)

    def begin(self, kind: str, target: str) -> int:
        self.windows.append(FaultWindow(kind=kind, target=target, start=time.monotonic()))
        return len(self.windows) - 1

    def end(self, index: int) -> None:
        window = self.windows[index]
        self.windows[index] = FaultWindow(
            kind=window.kind, target=window.target, start=window.start, end=time.monotonic()
        )

    def count(self, kind: str) -> int:
        return sum(1 for w in self.windows if w.kind == kind)


def apply_standing_faults(stack: Stack, log: FaultLog) -> None:
    """The faults that hold for the whole run: 429s with Retry-After, and added latency."""
    stack.sim.faults.set_error(rate=API_ERROR_RATE, code=429, retry_after=1)
    stack.sim.faults.set_latency(seconds=API_LATENCY_SECONDS)
    log.begin("apiserver-429", "*")
    log.begin("apiserver-latency", "*")


async def _every(rng: random.Random, mean: float, act: Callable[[], Awaitable[None]]) -> None:
    while True:
        await anyio.sleep(rng.expovariate(1 / mean))
        await act()


async def run_faults(stack: Stack, log: FaultLog, seed: int) -> None:
    """Inject the timed faults until cancelled."""
    rng = random.Random(f"rgpu-soak-faults:{seed}")
    servers = [s.name for s in stack.fleet.plan.servers]
    plans: list[tuple[float, Callable[[], Awaitable[None]]]] = [
        (12.0, lambda: _cut_watches(stack, log)),
        (25.0, lambda: _expire(stack, log)),
        (15.0, lambda: _lupine_down(stack, log, rng.choice(servers), rng)),
        (12.0, lambda: _foreign_client(stack, log, rng.choice(servers), rng)),
        (15.0, lambda: _not_ready(stack, log, rng.choice(servers), rng)),
        (20.0, lambda: _binding_failures(stack, log, rng)),
        (30.0, lambda: _lost_under_holder(stack, log, rng)),
    ]
    if stack.options.replicas > 1:
        names = [n for n in stack.services if stack.services[n].service in REPLICATED]
        plans.append((KILL_EVERY_SECONDS, lambda: _kill(stack, log, rng.choice(names), rng)))
    async with anyio.create_task_group() as tg:
        for i, (mean, act) in enumerate(plans):
            tg.start_soon(_every, random.Random(f"{seed}:{i}"), mean, act)


async def _cut_watches(stack: Stack, log: FaultLog) -> None:
    log.end(log.begin("cut-watches", "*"))
    stack.sim.faults.cut_watches()


async def _expire(stack: Stack, log: FaultLog) -> None:
    # Compaction drops history older than a moment ago, as etcd's does (older than minutes):
    # a watcher that keeps up resumes, one that fell behind gets 410 Expired and relists.
    floor = stack.sim.store.resource_version
    await anyio.sleep(COMPACTION_LAG_SECONDS)
    log.end(log.begin("410-expired", "*"))
    stack.sim.faults.expire_before(floor)
    stack.sim.faults.cut_watches()


async def _lupine_down(stack: Stack, log: FaultLog, server: str, rng: random.Random) -> None:
    lupine = stack.fleet.lupine.by_name(server)
    if lupine.fault is not None:
        return
    index = log.begin("lupine-down", server)
    await lupine.set_fault("down")
    await anyio.sleep(rng.uniform(2.0, 5.0))
    await lupine.set_fault(None)
    log.end(index)


def held_servers(stack: Stack) -> list[str]:
    """Servers some claim holds now, as their Leases in the store say."""
    leases = stack.sim.store.list("leases", label_selector=CLAIM_LEASES)
    held = []
    for lease in leases:
        annotations = lease["metadata"].get("annotations") or {}
        if annotations.get("rgpu.io/claims", "[]") not in ("", "[]"):
            held.append(str(annotations.get("rgpu.io/server", "")))
    return sorted(name for name in held if name)


async def _lost_under_holder(stack: Stack, log: FaultLog, rng: random.Random) -> None:
    """A held server goes down past the grace: every holder must be told (and, with
    ``evict``, moved)."""
    quiet = [s for s in held_servers(stack) if stack.fleet.lupine.by_name(s).fault is None]
    if not quiet or any(w.kind == "server-lost" and w.end is None for w in log.windows):
        return
    server = rng.choice(quiet)
    lupine = stack.fleet.lupine.by_name(server)
    index = log.begin("server-lost", server)
    await lupine.set_fault("down")
    await anyio.sleep(LOST_HOLD_SECONDS)
    await lupine.set_fault(None)
    log.end(index)


async def _foreign_client(stack: Stack, log: FaultLog, server: str, rng: random.Random) -> None:
    lupine = stack.fleet.lupine.by_name(server)
    client = f"foreign-{len(log.windows)}"
    index = log.begin("lupine-busy", server)
    lupine.add_client(client, [lupine.gpus[0].uuid], hostname="not-a-pod")
    await anyio.sleep(rng.uniform(2.0, 5.0))
    lupine.remove_client(client)
    log.end(index)


def _set_ready(stack: Stack, server: str, status: str) -> None:
    node: dict[str, Any] = stack.sim.store.get("nodes", server)
    for condition in node["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = status
            condition["reason"] = "KubeletReady" if status == "True" else "NodeStatusUnknown"
    stack.sim.store.replace("nodes", node, subresource="status")


async def _not_ready(stack: Stack, log: FaultLog, server: str, rng: random.Random) -> None:
    if any(w.kind == "node-not-ready" and w.end is None for w in log.windows):
        return
    index = log.begin("node-not-ready", server)
    _set_ready(stack, server, "False")
    await anyio.sleep(rng.uniform(2.0, 5.0))
    _set_ready(stack, server, "True")
    log.end(index)


async def _binding_failures(stack: Stack, log: FaultLog, rng: random.Random) -> None:
    index = log.begin("binding-500", "pods/binding")
    stack.sim.faults.set_error(verb="create", resource="pods/binding", rate=BINDING_ERROR_RATE)
    await anyio.sleep(rng.uniform(2.0, 4.0))
    stack.sim.faults.set_error(verb="create", resource="pods/binding", rate=0.0)
    log.end(index)


async def _kill(stack: Stack, log: FaultLog, name: str, rng: random.Random) -> None:
    if not stack.services[name].alive():
        return
    index = log.begin("kill-9", name)
    await stack.kill(name)
    # A Deployment's replacement: scheduled, pulled and started a moment later.
    await anyio.sleep(rng.uniform(0.5, 2.0))
    await stack.start(name)
    log.end(index)
