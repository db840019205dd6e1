"""Admission: what one pass over a long queue of gated pods costs the allocator, beside a target.

Run: ``python3 -m uv run --no-sync python bench/bench_queue.py [--servers 8] [--cards 4]
[--pods 250 1000 3000] [--rounds 15] [--granularity card]``

A pass decides every gated pod in line, and the leader runs one after each change that may let
a pod in (an arrival, a release, a bound pod). When the pool is full and the queue long, every
pass refuses the whole queue again: its cost grows with the queue, and a queue that grows
because the machine is short of CPU then costs more CPU per change — a soak on a contended
machine showed the leader's passes at about 40 % of a core with 1,000 pods in line. This bench
measures that pass through the allocator's own boundary: an allocator (lifespan run, in
process) on the simulated apiserver, a fleet whose every card is booked by admitted pods, and
P gated pods in line with the soak's mix of asks (1-3 containers of 1-2 cards, a memory ask on
40 %, an init container on 10 %, three namespaces, a tenth urgent). ``GET /v1/queue`` runs the
same pass as the leader over the whole queue (a dry pass: it books nothing), so its CPU is the
pass's; the figure is the median over ``--rounds``, CPU of the one process.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from asgi_lifespan import LifespanManager
from bench_allocator import make_fleet, make_topology

import rgpu_testkit as testkit
from rgpu_allocator import create_app
from rgpu_allocator.settings import AllocatorSettings
from rgpu_kubesim import ApiOptions, SimApiServer, run_apiserver
from rgpu_testkit import FakeDiscovery, eventually

PASS_TARGET_MS_PER_100 = 5.0
"""The CPU a pass may cost per 100 pods in line: a queue of 1,000 in 50 ms, so a leader
passing after every change of a busy pool stays a small share of a core."""

NAMESPACES = ("team-a", "team-b", "default")
GATE = {"name": "rgpu.io/admission"}
COUNT = "nvidia.com/remote-gpu"
MEMORY = "nvidia.com/remote-gpu-memory"


def asks(rng: random.Random) -> list[dict[str, Any]]:
    """The soak's mix of containers: 1-3 of 1-2 cards, 40 % with a memory ask."""
    made = []
    for i in range(rng.randint(1, 3)):
        limits = {COUNT: str(rng.randint(1, 2))}
        if rng.random() < 0.4:
            limits[MEMORY] = str(rng.choice((8192, 16384, 40960)))
        made.append(testkit.container_manifest(name=f"c{i}", limits=limits))
    return made


def gated(index: int, rng: random.Random, *, urgent: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingGates": [GATE]}
    if urgent:
        spec["priorityClassName"] = "urgent"
    init = []
    if rng.random() < 0.1:
        init = [testkit.container_manifest(name="init", limits={COUNT: "1"})]
    return testkit.pod_manifest(
        name=f"q-{index:05d}",
        namespace=rng.choice(NAMESPACES),
        scheduler="rgpu-scheduler",
        containers=asks(rng),
        init_containers=init,
        spec=spec,
    )


def prepare(sim: SimApiServer) -> None:
    for namespace in ("team-a", "team-b", "rgpu-system"):
        sim.store.create("namespaces", {"metadata": {"name": namespace}})
    sim.store.create("priorityclasses", {"metadata": {"name": "urgent"}, "value": 1000})


def settings(sim_url: str, granularity: str) -> AllocatorSettings:
    env = {
        "RGPU_KUBE_URL": sim_url,
        "RGPU_DISCOVERY_URL": "http://discovery.test",
        "RGPU_LISTEN": "127.0.0.1:0",
        "RGPU_LOG_LEVEL": "WARNING",
        "RGPU_AUTH": "none",
        "RGPU_GRANULARITY": granularity,
        "RGPU_ADMISSION": "gate",
    }
    return AllocatorSettings.from_env(env, service="allocator")


@contextlib.asynccontextmanager
async def allocator(
    sim: SimApiServer, servers: int, cards: int, granularity: str
) -> AsyncIterator[httpx.AsyncClient]:
    discovery = FakeDiscovery(make_fleet(servers, cards), make_topology(12))
    app = create_app(settings(sim.url, granularity), discovery_transport=discovery.transport)
    async with (
        LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://allocator"
        ) as client,
    ):
        yield client


async def settled(client: httpx.AsyncClient, pods: int) -> dict[str, Any]:
    """The queue once every pod is in it and admissions stopped: the pool is full."""
    last: list[int] = []

    async def still() -> bool:
        queue: dict[str, Any] = (await client.get("/v1/queue")).json()
        # Admitted pods leave the line (their gate is lifted); nothing binds them here.
        last.append(sum(1 for e in queue["pods"] if e["reason"] != "Admitting"))
        return len(last) > 3 and len(set(last[-4:])) == 1 and last[-1] > pods // 2

    await eventually(still, what="the queue settled", timeout=120, interval=0.5)
    got: dict[str, Any] = (await client.get("/v1/queue")).json()
    return got


async def one(servers: int, cards: int, pods: int, rounds: int, granularity: str) -> None:
    rng = random.Random(f"bench-queue:{pods}")
    async with run_apiserver(options=ApiOptions(bookmark_interval_seconds=0.2)) as sim:
        prepare(sim)
        for i in range(pods):
            sim.store.create("pods", gated(i, rng, urgent=rng.random() < 0.1))
        async with allocator(sim, servers, cards, granularity) as client:
            queue = await settled(client, pods)
            waits: dict[str, int] = {}
            for entry in queue["pods"]:
                waits[str(entry["reason"])] = waits.get(str(entry["reason"]), 0) + 1
            cpu = []
            for _ in range(rounds):
                start = time.process_time()
                (await client.get("/v1/queue")).raise_for_status()
                cpu.append((time.process_time() - start) * 1000)
    median = statistics.median(cpu)
    target = PASS_TARGET_MS_PER_100 * pods / 100
    ok = "ok" if median <= target else "MISSED"
    print(
        f"pass over {pods:>5} gated pods: {median:8.1f} ms CPU "
        f"(target {target:.0f} ms) {ok}   waits {dict(sorted(waits.items()))}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--cards", type=int, default=4)
    parser.add_argument("--pods", type=int, nargs="+", default=[250, 1000, 3000])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--granularity", choices=("server", "card"), default="card")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(
        f"admission pass, {args.servers} servers x {args.cards} cards, {args.granularity} "
        f"granularity (load {load})"
    )
    for pods in args.pods:
        anyio.run(one, args.servers, args.cards, pods, args.rounds, args.granularity)


if __name__ == "__main__":
    main()
