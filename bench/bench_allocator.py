"""Allocator: decision time, pod event cost, memory at 100k pods, restart recovery, beside targets.

Run: ``python3 -m uv run --no-sync python bench/bench_allocator.py [--servers 1000] [--cards 8]
[--pods 100000] [--claims 10000]``

Figures (medians over rounds unless said otherwise):

* decision, server granularity - ``choose`` over N servers x C cards with half the servers
  held (claims in the ledger, holders in the pod cache), 200 candidate client nodes spread
  over racks/zones, a fresh ``Occupancy`` per decision: everything the allocator does for a
  ``POST /v1/allocations`` except the apiserver write and HTTP
* decision, card granularity     - the same with card granularity and half of every server's
  cards held
* refusal (everything held)      - the slow path: every server held by a running, bound pod,
  each judged to build HAMi's reasons, successive refusals sharing one replica's memo of
  time-independent verdicts as they do in the allocator (no target; shown for scale)
* fleet change (one server busy) - the allocator's view updated for a fleet in which one
  server changed (as discovery's deltas deliver it), 5,000 client nodes; beside it, the view
  built anew, as it was before
* pod event applied              - one MODIFIED pod (a realistic Pod dict, already decoded
  from the watch line, as the watch hands it over) slimmed, stored and routed to the
  reconciler, on a cache of P pods
* RSS with P pods                - ``python -m rgpu_allocator`` as a child process, synced
  against a simulated apiserver holding P pods (plus the fleet's claims): the child's
  resident set, read from /proc once it reports ``synced``
* recovery of K claims           - a fresh allocator (in process) started against an apiserver
  holding K claims in Leases and their K pods: time from start to serving with every claim
  loaded (readiness), then one idempotent re-allocation answered from the recovered state
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NoReturn

import anyio
import anyio.abc
import httpx
import orjson
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_allocator import create_app
from rgpu_allocator.claims import LeaseRecord, encode_lease
from rgpu_allocator.judging import occupancy_of
from rgpu_allocator.ledger import Ledger
from rgpu_allocator.pods import PodIndex, PodInfo, pod_info
from rgpu_allocator.settings import AllocatorSettings
from rgpu_allocator.settled import Settled
from rgpu_allocator.watching import PodHooks, pod_changed
from rgpu_contracts import (
    AllocationRequest,
    Card,
    CardId,
    Claim,
    ClaimState,
    ContainerAssignment,
    ContainerKind,
    ContainerRequest,
    Fleet,
    GpuUuid,
    NodeName,
    NodeTopology,
    PodRef,
    PodUID,
    Server,
    ServerName,
    Topology,
)
from rgpu_kubesim import ApiOptions, run_apiserver
from rgpu_placement import Choice, FleetView, Granularity, Refusal, choose, demand_of
from rgpu_runtime.kube import Reflector, WatchEvent
from rgpu_runtime.serving import Listener, running

DECISION_TARGET_MS = 1.0
FLEET_CHANGE_TARGET_MS = 3.0
EVENT_TARGET_US = 50.0
RSS_TARGET_MB = 300.0
RECOVERY_TARGET_S = 5.0

KEYS = ("topology.rgpu.io/rack", "topology.kubernetes.io/zone", "topology.kubernetes.io/region")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "k8s" / "watch-pods.jsonl"
NAMESPACE = "rgpu-system"


# -- building blocks -------------------------------------------------------------------------


def labels(index: int) -> dict[str, str]:
    return {KEYS[0]: f"rack-{index % 50}", KEYS[1]: f"zone-{index % 5}", KEYS[2]: "region-1"}


def make_server(index: int, cards: int) -> Server:
    name = f"gpu-{index:05d}"
    made = tuple(
        Card(
            id=CardId(f"{name}/GPU-{index:05d}-{c:02d}"),
            server=ServerName(name),
            uuid=GpuUuid(f"GPU-{index:05d}-{c:02d}"),
            index=c,
            memory_mib=81920,
            cores=100,
            model="A100",
            numa=c // 4,
            healthy=True,
        )
        for c in range(cards)
    )
    return Server(
        name=ServerName(name),
        endpoint=f"10.1.{index // 250}.{index % 250}:14833",
        port=14833,
        ready=True,
        reachable=True,
        usage_reported=True,
        busy=frozenset(),
        topology=tuple(sorted(labels(index).items())),
        cards=made,
    )


def make_fleet(servers: int, cards: int) -> Fleet:
    return Fleet(
        revision=1,
        observed_at=time.time(),
        servers=tuple(make_server(i, cards) for i in range(servers)),
    )


def make_topology(nodes: int) -> Topology:
    return Topology(
        revision=1,
        nodes=tuple(
            NodeTopology(name=NodeName(f"client-{i:05d}"), labels=tuple(labels(i * 7).items()))
            for i in range(nodes)
        ),
    )


def claim_on(server: Server, pod: PodRef, cards: tuple[Card, ...], *, at: float) -> Claim:
    ids = tuple(c.id for c in cards)
    return Claim(
        pod=pod,
        server=server.name,
        cards=ids,
        containers=(ContainerAssignment(name="main", cards=ids),),
        state=ClaimState.BOUND,
        booked_at=at,
        committed_at=at,
        node=NodeName("client-00001"),
    )


def fixture_pod() -> dict[str, Any]:
    first = FIXTURE.read_text().splitlines()[0]
    pod: dict[str, Any] = orjson.loads(first)["object"]
    return pod


def pod_named(template: dict[str, Any], index: int, *, uid: bool = True) -> dict[str, Any]:
    pod = copy.deepcopy(template)
    meta = pod["metadata"]
    meta["name"] = f"trainer-{index:06d}"
    meta["namespace"] = f"team-{index % 40}"
    if uid:
        meta["uid"] = f"00000000-0000-4000-8000-{index:012d}"
    else:
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            meta.pop(key, None)
    pod["spec"]["nodeName"] = f"client-{index % 1000:05d}"
    pod["status"] = {"phase": "Running"}
    return pod


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000.0


def p90_ms(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10)[-1] * 1000.0


def show(name: str, value: float, unit: str, target: float | None, extra: str = "") -> None:
    beside = "" if target is None else f"target <= {target:g} {unit}  "
    verdict = "" if target is None else ("ok" if value <= target else "MISSED")
    print(f"{name:<34} {value:10.3f} {unit:<3} {beside}{verdict} {extra}")


# -- decisions -------------------------------------------------------------------------------


def seeded_state(
    fleet: Fleet, granularity: Granularity, *, everything: bool = False
) -> tuple[Ledger, PodIndex]:
    """Half the servers held (server granularity) or half of every server's cards (card);
    ``everything``: every server held whole. Each holder is a running, bound pod."""
    ledger, pods = Ledger(), PodIndex()
    now = time.time()
    records = []
    for i, server in enumerate(fleet.servers):
        if granularity == "server" and i % 2 and not everything:
            continue
        pod = PodRef(uid=PodUID(f"holder-{i}"), namespace="ml", name=f"holder-{i}")
        cards = server.cards if granularity == "server" else server.cards[: len(server.cards) // 2]
        records.append(
            LeaseRecord(
                name=f"rgpu-{server.name}",
                server=server.name,
                resource_version="1",
                claims=(claim_on(server, pod, cards, at=now),),
            )
        )
        pods.put(
            PodInfo(
                uid=pod.uid,
                namespace="ml",
                name=pod.name,
                node_name="client-00001",
                phase="Running",
                scheduler_name="rgpu-scheduler",
                has_allocated=True,
            )
        )
    ledger.replace_all(records)
    return ledger, pods


def bench_decisions(
    view: FleetView, ledger: Ledger, pods: PodIndex, granularity: Granularity, rounds: int
) -> tuple[list[float], str]:
    candidates = tuple(NodeName(f"client-{i:05d}") for i in range(0, 2000, 10))
    containers = (ContainerRequest(name="main", kind=ContainerKind.APP, count=2, memory_mib=40000),)
    samples = []
    outcome: Choice | Refusal | None = None
    settled = Settled()  # one replica's, shared by its decisions as the Judge shares it
    for i in range(rounds):
        started = time.perf_counter()
        demand = demand_of(containers)
        held = occupancy_of(
            ledger, pods, uid=f"new-{i}", now=time.time(), ttl=30.0, settled=settled
        )
        outcome = choose(view, demand, held, candidates=candidates, granularity=granularity)
        samples.append(time.perf_counter() - started)
    kind = "chose " + outcome.fit.facts.name if isinstance(outcome, Choice) else "refused"
    return samples, kind


def decisions(servers: int, cards: int, rounds: int) -> None:
    fleet = make_fleet(servers, cards)
    view = FleetView.build(fleet, make_topology(2000), KEYS)
    for granularity in ("server", "card"):
        ledger, pods = seeded_state(fleet, granularity)
        samples, kind = bench_decisions(view, ledger, pods, granularity, rounds)
        show(
            f"decision, {granularity} granularity",
            median_ms(samples),
            "ms",
            DECISION_TARGET_MS,
            f"(p90 {p90_ms(samples):.3f} ms; {kind}; {servers}x{cards})",
        )
    everything, holders = seeded_state(fleet, "server", everything=True)
    samples, kind = bench_decisions(view, everything, holders, "server", max(rounds // 10, 5))
    show("refusal (everything held)", median_ms(samples), "ms", None, f"({kind}, for scale)")
    fleet_changes(fleet, make_topology(5000), rounds)


def fleet_changes(fleet: Fleet, topology: Topology, rounds: int) -> None:
    """One server turning busy: the view updated for the new fleet, against built anew."""
    view = FleetView.build(fleet, topology, KEYS)
    updated, rebuilt = [], []
    for i in range(min(rounds, 50)):
        servers = list(fleet.servers)
        at = i % len(servers)
        servers[at] = dataclasses.replace(servers[at], busy=frozenset({servers[at].cards[0].uuid}))
        newer = dataclasses.replace(fleet, servers=tuple(servers), revision=fleet.revision + i + 1)
        started = time.perf_counter()
        view.with_fleet(newer)
        updated.append(time.perf_counter() - started)
        started = time.perf_counter()
        FleetView.build(newer, topology, KEYS)
        rebuilt.append(time.perf_counter() - started)
    show(
        "fleet change (one server busy)",
        median_ms(updated),
        "ms",
        FLEET_CHANGE_TARGET_MS,
        f"(built anew: {median_ms(rebuilt):.1f} ms; {len(fleet.servers)} servers, 5000 nodes)",
    )


# -- pod events ------------------------------------------------------------------------------


def modified(pod: dict[str, Any], version: int) -> WatchEvent:
    # A new resourceVersion each round, or the reflector would skip it as already seen.
    pod["metadata"]["resourceVersion"] = str(version + 1)
    return WatchEvent(type="MODIFIED", object=pod)


def pod_reflector(pods: PodIndex, hooks: PodHooks) -> Reflector[PodInfo]:
    """The allocator's pod reflector, driven by hand: never run, only ``apply``."""

    def never(*_: object) -> NoReturn:
        raise AssertionError("the benchmark applies events by hand")

    return Reflector[PodInfo](
        name="pods",
        list_pages=never,
        watch=never,
        transform=pod_info,
        on_change=pod_changed(pods, hooks),
    )


def pod_events(pods_count: int, rounds: int) -> None:
    template = fixture_pod()
    pods = PodIndex()
    for i in range(pods_count):
        info = pod_info(pod_named(template, i))
        assert info is not None
        pods.put(info)
    ledger = Ledger()
    routed: list[str] = []

    def hooks(before: PodInfo | None, after: PodInfo | None) -> None:
        # What Reconciler.pod_changed reads: the ledger, then maybe one enqueue.
        uid = (after or before).uid  # type: ignore[union-attr]
        if ledger.servers_of(uid) or (after is not None and after.finished):
            routed.append(uid)

    events = [modified(pod_named(template, i % pods_count), i) for i in range(rounds)]
    reflector = pod_reflector(pods, hooks)
    samples = []
    for event in events:
        started = time.perf_counter()
        reflector.apply(event)
        samples.append(time.perf_counter() - started)
    show(
        "pod event applied",
        statistics.median(samples) * 1e6,
        "us",
        EVENT_TARGET_US,
        f"(p90 {statistics.quantiles(samples, n=10)[-1] * 1e6:.1f} us; cache of {pods_count} pods)",
    )


# -- processes: RSS and recovery -------------------------------------------------------------


def discovery_app(fleet: Fleet, closing: anyio.Event) -> Starlette:
    """A discovery that never changes; held long-polls end when ``closing`` is set."""
    body = orjson.dumps(fleet.to_dict())
    empty = orjson.dumps(Topology(revision=1, nodes=()).to_dict())

    async def hold(request: Request, revision: int) -> None:
        if request.query_params.get("since") == str(revision):
            with anyio.move_on_after(float(request.query_params.get("wait", "30"))):
                await closing.wait()

    async def fleet_route(request: Request) -> Response:
        await hold(request, fleet.revision)
        return Response(body, media_type="application/json")

    async def topology_route(request: Request) -> Response:
        await hold(request, 1)
        return Response(empty, media_type="application/json")

    return Starlette(
        routes=[Route("/v1/fleet", fleet_route), Route("/v1/topology", topology_route)]
    )


def seed_pods(sim: Any, count: int, template: dict[str, Any]) -> list[dict[str, Any]]:
    for namespace in {f"team-{i % 40}" for i in range(min(count, 40))} | {NAMESPACE}:
        with contextlib.suppress(Exception):
            sim.store.create("namespaces", {"metadata": {"name": namespace}})
    return [sim.store.create("pods", pod_named(template, i, uid=False)) for i in range(count)]


def seed_claims(sim: Any, fleet: Fleet, made: list[dict[str, Any]], count: int) -> None:
    now = time.time()
    per_server: dict[ServerName, list[Claim]] = {}
    for i in range(count):
        server = fleet.servers[i % len(fleet.servers)]
        slot = (i // len(fleet.servers)) % len(server.cards)
        meta = made[i]["metadata"]
        pod = PodRef(uid=PodUID(meta["uid"]), namespace=meta["namespace"], name=meta["name"])
        per_server.setdefault(server.name, []).append(
            claim_on(server, pod, (server.cards[slot],), at=now)
        )
    for name, claims in per_server.items():
        body = encode_lease(server=name, namespace=NAMESPACE, claims=claims, resource_version=None)
        sim.store.create("leases", body, namespace=NAMESPACE)


_SERVING = re.compile(rb"serving on (http://127\.0\.0\.1:\d+)")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


@contextlib.asynccontextmanager
async def serving_discovery(fleet: Fleet) -> AsyncIterator[str]:
    closing = anyio.Event()
    async with running(discovery_app(fleet, closing), Listener(listen="127.0.0.1:0")) as urls:
        try:
            yield urls[0]
        finally:
            closing.set()


async def wait_fleet(client: httpx.AsyncClient) -> None:
    with anyio.fail_after(30):
        while True:
            if (await client.get("/v1/status")).json()["fleetRevision"] is not None:
                return
            await anyio.sleep(0.01)


async def wait_synced(url: str, claims: int, timeout: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        with anyio.fail_after(timeout):
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    status = (await client.get("/v1/status")).json()
                    if status["synced"] and status["claims"] >= claims:
                        return
                await anyio.sleep(0.1)


@contextlib.asynccontextmanager
async def child(env: dict[str, str]) -> AsyncIterator[tuple[anyio.abc.Process, str]]:
    process = await anyio.open_process(
        [sys.executable, "-m", "rgpu_allocator"], env=env, stdout=subprocess.DEVNULL
    )
    found: list[str] = []
    ready = anyio.Event()

    async def drain() -> None:
        assert process.stderr is not None
        buffer = b""
        async for chunk in process.stderr:
            buffer = (buffer + chunk)[-65536:]
            match = _SERVING.search(buffer)
            if match and not found:
                found.append(match.group(1).decode())
                ready.set()
        ready.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            with anyio.fail_after(120):
                await ready.wait()
            assert found, "the allocator exited before serving"
            yield process, found[0]
            tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.terminate()
        with anyio.CancelScope(shield=True):
            await process.wait()


def base_env(sim_url: str, discovery_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RGPU_", "OTEL_"))}
    env.update(
        RGPU_KUBE_URL=sim_url,
        RGPU_DISCOVERY_URL=discovery_url,
        RGPU_LISTEN="127.0.0.1:0",
        RGPU_LOG_LEVEL="INFO",
        RGPU_LOG_FORMAT="text",
        RGPU_BOOKING_TTL_SECONDS="3600",
        # It measures decisions and memory, not the callers' token check.
        RGPU_AUTH="none",
    )
    return env


async def memory(pods_count: int, servers: int, cards: int) -> None:
    fleet = make_fleet(servers, cards)
    options = ApiOptions(bookmark_interval_seconds=5.0)
    async with run_apiserver(options=options) as sim:
        started = time.perf_counter()
        made = seed_pods(sim, pods_count, fixture_pod())
        seed_claims(sim, fleet, made, min(len(made), servers))
        seeded = time.perf_counter() - started
        del made
        async with serving_discovery(fleet) as url:
            env = base_env(sim.url, url)
            async with child(env) as (process, base):
                await wait_synced(base, min(pods_count, servers), timeout=600)
                await anyio.sleep(1.0)
                rss = rss_mb(process.pid)
    show(
        f"RSS with {pods_count} pods",
        rss,
        "MB",
        RSS_TARGET_MB,
        f"(child process, synced; apiserver seeded in {seeded:.1f} s)",
    )


async def recovery(claims: int, cards: int) -> None:
    servers = max(claims // cards, 1)
    fleet = make_fleet(servers, cards)
    async with run_apiserver(options=ApiOptions(bookmark_interval_seconds=5.0)) as sim:
        made = seed_pods(sim, claims, fixture_pod())
        seed_claims(sim, fleet, made, claims)
        meta = made[0]["metadata"]
        pod = PodRef(uid=PodUID(meta["uid"]), namespace=meta["namespace"], name=meta["name"])
        async with serving_discovery(fleet) as url:
            settings = AllocatorSettings.from_env(
                {k: v for k, v in base_env(sim.url, url).items() if k.startswith("RGPU_")}
            )
            started = time.perf_counter()
            app = create_app(settings)
            async with LifespanManager(app, startup_timeout=120) as manager:
                loaded = time.perf_counter() - started
                transport = httpx.ASGITransport(app=manager.app)
                async with httpx.AsyncClient(transport=transport, base_url="http://a") as client:
                    status = (await client.get("/v1/status")).json()
                    request = AllocationRequest(
                        pod=pod,
                        containers=(
                            ContainerRequest(name="main", kind=ContainerKind.APP, count=1),
                        ),
                    )
                    await wait_fleet(client)
                    again = await client.post("/v1/allocations", json=request.to_dict())
    same = again.status_code == 200 and again.json()["server"] == fleet.servers[0].name
    show(
        f"recovery of {claims} claims",
        loaded,
        "s",
        RECOVERY_TARGET_S,
        f"({status['claims']} claims, {status['pods']} pods loaded; "
        f"re-allocation {'same server' if same else 'DIFFERENT: ' + again.text[:80]})",
    )


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--skip-processes", action="store_true", help="only the in-memory figures")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    decisions(args.servers, args.cards, args.rounds)
    pod_events(min(args.pods, 100_000), args.rounds * 10)
    if not args.skip_processes:
        anyio.run(recovery, args.claims, args.cards)
        anyio.run(memory, args.pods, args.servers, args.cards)


if __name__ == "__main__":
    main()
