"""The whole system as a cluster loads it: figures beside the targets of issue 15.

Run: ``make bench-system`` (full size, about 10 minutes per granularity on 2 cores) or
``python3 -m uv run --no-sync python bench/bench_system.py [--servers 1000] [--cards 8]
[--clients 5000] [--background 100000] [--burst 1000] [--rate 50] [--stream-seconds 60]
[--free-rate 10] [--granularity both] [--probe-interval 15] [--profile DIR] [--json FILE]``

The acceptance check of ``rgpu up --sim --servers 400 --cards 8 --clients 400`` (a burst of 400
one-GPU pods bound in seconds) is this benchmark's burst alone, on the same stack with
``rgpu up``'s probe interval: ``--servers 400 --clients 400 --background 0 --burst 400
--rest-seconds 1 --stream-seconds 0 --granularity server --probe-interval 1``.

The four services run as separate processes over real HTTP (``rgpu_sim.stack``); the simulated
apiserver, the fake lupine servers and the scheduler and kubelet emulators run in this process
(reported together as ``kubesim+emulators``). Pods that ask for no GPU are written straight into
the apiserver's store before the services start, bound and Running, as a cluster has them. GPU
pods go through the admission webhook. Per granularity, on a fresh stack:

* rest    - nothing scheduled for ``--rest-seconds`` (60 s, four probe rounds): each process's
  CPU while discovery probes every server every 15 s (the deployed interval); the probe
  states' heartbeats (every 300 s) fall after it on a fresh stack, and the fifth round of
  docs/sizing-journal.md gives what they add in the steady state
* burst   - ``--burst`` pods created at once (one card each; a whole server's cards in card
  granularity), which fills a 1,000-server fleet; pods bound per second from the first
  creation to the last binding; the pods keep their cards
* stream  - ``--rate`` one-card pods/s (half a server's cards in card granularity) for
  ``--stream-seconds`` onto that full fleet, while the burst's pods are deleted at
  ``--free-rate`` per second: each deletion frees room that waiting pods need; "freed -> bound"
  is the time from the holder's end (its containers stopped after the deletion) to the first
  binding onto the freed server
* relist  - the HAMi-style baseline: one full pod list (HAMi re-lists every pod every 15 s and
  on forced refreshes; forced refreshes are not counted, so the ratio is a lower bound) against
  the bytes rgpu's pod watches received per 15 s of the stream

``/filter``, ``/prioritize`` and ``/bind`` latencies are as the scheduler emulator measured
them (``SchedulerEmulator.latencies``); apiserver requests come from kubesim's request meter,
by verb and resource, for the rgpu services' clients only. ``--profile DIR`` records every
process with py-spy during the burst and prints where the time went; py-spy must be installed
(``python3 -m uv pip install py-spy``), it is not a project dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _system_measure as m
import _system_report as report
import aiohttp
import anyio
import httpx
import orjson
from _system_report import Phase

from rgpu_kubesim import Store
from rgpu_kubesim.fleet import ContainerPlan, PodPlan, WorkloadSpec
from rgpu_kubesim.kubelet import KubeletConfig
from rgpu_sim.stack import Stack, StackOptions, run_stack

PROBE_INTERVAL_SECONDS = 15.0
"""The deployed probe interval."""
WORKLOAD = WorkloadSpec(pods=0)
CREATIONS_IN_FLIGHT = 100
"""httpx's default connection pool size."""
HOLD_SECONDS = 3600.0
"""Pods hold their cards until deleted: capacity is freed when the benchmark says so."""


# -- the cluster -------------------------------------------------------------------------------


def _background_pod(i: int, node: str) -> dict[str, Any]:
    name = f"web-{i:06d}"
    labels = {"app.kubernetes.io/name": "web", "pod-template-hash": f"{i % 997:x}"}
    container = {
        "name": "web",
        "image": "registry.local/web:1.4.2",
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "env": [{"name": "MODE", "value": "serve"}],
    }
    status = {
        "phase": "Running",
        "hostIP": "10.0.0.1",
        "podIP": f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "containerStatuses": [
            {
                "name": "web",
                "ready": True,
                "restartCount": 0,
                "image": "registry.local/web:1.4.2",
                "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}},
            }
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": node, "containers": [container], "restartPolicy": "Always"},
        "status": status,
    }


def background(count: int) -> Callable[[Store], None]:
    """Writes ``count`` Running, GPU-less pods spread over the client nodes."""

    def prepare(store: Store) -> None:
        nodes = [
            str(n["metadata"]["name"])
            for n in store.list("nodes")
            if "hami.io/lupine-server" not in (n["metadata"].get("labels") or {})
        ]
        for i in range(count):
            store.create("pods", _background_pod(i, nodes[i % len(nodes)]))

    return prepare


def gpu_pod(name: str, cards: int, run_seconds: float) -> dict[str, Any]:
    plan = PodPlan(
        name=name,
        namespace="default",
        arrival_seconds=0.0,
        run_seconds=run_seconds,
        containers=(ContainerPlan(name="main", cards=cards, memory_mib=None),),
        spec=WORKLOAD,
    )
    return plan.manifest()


# -- driving -----------------------------------------------------------------------------------


_USER = {"X-Sim-User": "alice", "User-Agent": "bench-user", "Content-Type": "application/json"}


class Creator:
    """Creates pods as a user's client would (``X-Sim-User: alice``, through the webhook).

    aiohttp, not ``Stack.create_pod``'s httpx: the client runs in this process, whose CPU is
    reported as the simulation's, and a user's kubectl would run in a process of its own.
    """

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def create(self, manifest: dict[str, Any], into: list[str]) -> None:
        meta = manifest["metadata"]
        pods = f"{self.url}/api/v1/namespaces/{meta['namespace']}/pods"
        for attempt in range(3):
            try:
                async with self.session.post(
                    pods, data=orjson.dumps(manifest), headers=_USER
                ) as response:
                    status, body = response.status, await response.read()
                break
            except aiohttp.ClientConnectionError:
                # A pooled connection the apiserver closed as idle: send again (a 409 means
                # the first attempt had created the pod after all).
                if attempt == 2:
                    raise
        if status == 409:
            async with self.session.get(f"{pods}/{meta['name']}", headers=_USER) as response:
                status, body = response.status, await response.read()
        if status not in (200, 201):
            raise RuntimeError(f"pod creation refused: {status} {body[:300]!r}")
        into.append(str(orjson.loads(body)["metadata"]["uid"]))


async def _create(
    creator: Creator, manifest: dict[str, Any], into: list[str], limit: anyio.CapacityLimiter
) -> None:
    async with limit:
        await creator.create(manifest, into)


STALL_SECONDS = 20.0
"""A phase ends when its pods are bound or no pod was bound for this long (pods left waiting
for kube-scheduler's 5-minute flush are reported as unbound, not waited for)."""


async def _until_bound(stack: Stack, uids: Sequence[str], timeout: float) -> None:
    bound, progress = -1, time.monotonic()
    with anyio.move_on_after(timeout):
        while time.monotonic() - progress < STALL_SECONDS:
            records = stack.scheduler.records
            now = sum(1 for u in uids if u in records and records[u].bound_at)
            if now == len(uids):
                return
            if now != bound:
                bound, progress = now, time.monotonic()
            await anyio.sleep(0.1)


async def _fleet_probed(stack: Stack, servers: int, timeout: float) -> None:
    async with httpx.AsyncClient(base_url=stack.url("discovery"), timeout=60) as client:
        with anyio.move_on_after(timeout):
            while True:
                listed = (await client.get("/v1/fleet")).json().get("servers") or []
                probed = sum(1 for s in listed if s.get("usageReported"))
                if len(listed) == servers and probed == servers:
                    return
                await anyio.sleep(1.0)


class Meter:
    """Samples the processes, the apiserver tally and the emulator's latencies around a phase."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.pids = {name: p.process.pid for name, p in stack.services.items() if p.process}
        self.pids["kubesim+emulators"] = os.getpid()

    def __enter__(self) -> Phase:
        self.phase = Phase(started=time.monotonic())
        self._procs = m.samples(self.pids)
        self._tally = self.stack.sim.meter.snapshot()
        self._kept = {k: len(v) for k, v in self.stack.scheduler.latencies().items()}
        self._filters = self.filter_buckets()
        return self.phase

    def __exit__(self, *exc: object) -> None:
        phase = self.phase
        phase.ended = time.monotonic()
        phase.cpu = m.cpu_between(self._procs, m.samples(self.pids))
        phase.tally = m.tally_between(self._tally, self.stack.sim.meter.snapshot())
        latencies = self.stack.scheduler.latencies().items()
        phase.latencies = {k: list(v[self._kept.get(k, 0) :]) for k, v in latencies}
        filters = self.filter_buckets()
        p50, p99 = (1000 * m.bucket_quantile(self._filters, filters, q) for q in (0.5, 0.99))
        phase.filter_inside_ms = (p50, p99)
        phase.load = m.load_average()

    def filter_buckets(self) -> dict[float, float]:
        """The extender's own ``/filter`` histogram, as its ``/metrics`` says now."""
        url = f"{self.stack.url('extender')}/metrics"
        text = httpx.get(url, timeout=30, verify=self.stack.scheduler_tls).text
        return m.histogram_buckets(text, "rgpu_extender_verb_duration_seconds", verb="filter")


async def burst(
    stack: Stack, creator: Creator, count: int, cards: int, profile: Path | None, meter: Meter
) -> Phase:
    """``count`` pods created at once; they hold their cards until the stream deletes them."""
    profiler = m.Profiler.start(meter.pids, profile, "burst") if profile else None
    # As many creations in flight as the client's connection pool holds (a controller's
    # client is rate-limited too); the rest queue here instead of timing out in the pool.
    limit = anyio.CapacityLimiter(CREATIONS_IN_FLIGHT)
    with meter as phase:
        async with anyio.create_task_group() as tg:
            for i in range(count):
                manifest = gpu_pod(f"burst-{i:05d}", cards, HOLD_SECONDS)
                tg.start_soon(_create, creator, manifest, phase.pods, limit)
        await _until_bound(stack, phase.pods, timeout=max(180.0, count / 2))
    if profiler is not None:
        report.show_profiles(profiler.stop())
    return phase


async def _free(stack: Stack, holders: Sequence[str], rate: float, phase: Phase) -> None:
    """Delete the burst's pods at ``rate`` per second, noting when each server was freed."""
    for i, uid in enumerate(holders):
        await anyio.sleep(max(0.0, phase.started + i / rate - time.monotonic()))
        run = stack.kubelet.records.get(uid)
        if run is None:
            continue
        namespace, name = run.key.split("/", 1)
        response = await stack.apiserver.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if response.status_code == 200:
            phase.freed[uid] = time.monotonic()


async def stream(
    stack: Stack,
    creator: Creator,
    args: argparse.Namespace,
    holders: Sequence[str],
    meter: Meter,
) -> Phase:
    """``--rate`` pods/s for ``--stream-seconds`` onto a full fleet while the burst's pods are
    deleted at ``--free-rate`` per second: each deletion frees room a parked pod waits for."""
    per_pod = 1 if args.granularity_now == "server" else max(1, args.cards // 2)
    limit = anyio.CapacityLimiter(CREATIONS_IN_FLIGHT)
    with meter as phase:
        async with anyio.create_task_group() as tg:
            if args.free_rate > 0:
                tg.start_soon(_free, stack, holders, args.free_rate, phase)
            for i in range(int(args.rate * args.stream_seconds)):
                await anyio.sleep(max(0.0, phase.started + i / args.rate - time.monotonic()))
                manifest = gpu_pod(f"stream-{i:05d}", per_pod, HOLD_SECONDS)
                tg.start_soon(_create, creator, manifest, phase.pods, limit)
            await _until_bound(stack, phase.pods, timeout=args.grace_seconds)
            tg.cancel_scope.cancel()
    return phase


def _list_every_pod(url: str) -> tuple[int, float]:
    """A HAMi refresh from a thread of its own: (bytes, this thread's CPU to receive and decode)."""
    started = time.thread_time()
    with httpx.Client(base_url=url, timeout=300, headers={"User-Agent": "hami-baseline"}) as c:
        body = c.get("/api/v1/pods").content
    orjson.loads(body)
    return len(body), time.thread_time() - started


async def _rest_rate(pid: int, seconds: float = 3.0) -> float:
    before = m.sample(pid)
    await anyio.sleep(seconds)
    return (m.sample(pid).cpu_seconds - before.cpu_seconds) / seconds


async def relist(stack: Stack, rounds: int = 2) -> dict[str, float]:
    """HAMi's refresh (every pod listed), measured: bytes; the client's CPU on its thread; the
    apiserver's as this process's CPU over the lists minus the client's and minus the lower of
    the rates at rest just before and just after (the emulators' own background work)."""
    own = os.getpid()
    rate_before = await _rest_rate(own)
    size, client = 0, 0.0
    before = m.sample(own)
    for _ in range(rounds):
        size, spent = await anyio.to_thread.run_sync(_list_every_pod, stack.sim.url)
        client += spent
    after = m.sample(own)
    idle = min(rate_before, await _rest_rate(own)) * (after.at - before.at)
    server = max(0.0, after.cpu_seconds - before.cpu_seconds - idle - client)
    return {"bytes": size, "apiserver_cpu": server / rounds, "decode": client / rounds}


# -- one granularity ---------------------------------------------------------------------------


def _say(granularity: str, what: str) -> None:
    print(f"[{granularity}] {what}; load average {m.load_average()}", flush=True)


def _admission_env(mode: str) -> dict[str, dict[str, str]]:
    return {s: {"RGPU_ADMISSION": mode} for s in ("allocator", "extender")}


async def run(args: argparse.Namespace, granularity: str, admission: str) -> dict[str, Any]:
    """Rest, burst, stream and relist on a fresh stack; the figures."""
    options = StackOptions(
        servers=args.servers,
        cards=args.cards,
        clients=args.clients,
        seed=args.seed,
        granularity=granularity,
        probe_interval_seconds=args.probe_interval,
        kubelet=KubeletConfig(start_delay_seconds=0.2),
        work_dir=Path(tempfile.mkdtemp(prefix=f"bench-system-{granularity}-{admission}-")),
        prepare=background(args.background),
        extra_env=_admission_env(admission),
    )
    args.granularity_now = granularity
    started = time.monotonic()
    async with run_stack(options) as stack, aiohttp.ClientSession(trust_env=False) as session:
        creator = Creator(stack.sim.url, session)
        _say(granularity, f"stack up in {time.monotonic() - started:.0f} s ({options.work_dir})")
        await _fleet_probed(stack, args.servers, timeout=180.0)
        meter = Meter(stack)
        with meter as rest:
            await anyio.sleep(args.rest_seconds)
        _say(granularity, "rest measured")
        # In card granularity burst pods ask for a whole server's cards, so the fleet is full
        # in both and the stream's pods park until a deletion frees room.
        cards = 1 if granularity == "server" else args.cards
        b = await burst(stack, creator, args.burst, cards, args.profile, meter)
        _say(granularity, "burst bound")
        s = await stream(stack, creator, args, b.pods, meter)
        _say(granularity, "stream done")
        baseline = await relist(stack)
        return report.figures(stack, meter.pids, (rest, b, s), baseline, admission=admission)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--background", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--stream-seconds", type=float, default=60.0)
    parser.add_argument(
        "--free-rate",
        type=float,
        default=10.0,
        help="burst pods deleted/s; 0 deletes none (the stream then lands on free servers)",
    )
    parser.add_argument("--grace-seconds", type=float, default=30.0)
    # A whole heartbeat period of the probe states (60 s at the deployed 15 s interval): the
    # states written in the first round fall due together, so a shorter window reads 5-10 %
    # depending on whether it holds their rewrite.
    parser.add_argument("--rest-seconds", type=float, default=60.0)
    parser.add_argument("--granularity", choices=("server", "card", "both"), default="both")
    parser.add_argument(
        "--admission",
        choices=("gate", "filter", "both"),
        default="gate",
        help="gate: rgpu admits pods behind a scheduling gate (the default); filter: HAMi's "
        "flow, booking inside kube-scheduler's /filter; both: one run of each",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--probe-interval",
        type=float,
        default=PROBE_INTERVAL_SECONDS,
        help="discovery's probe interval, s (15 as deployed; rgpu up --sim probes every 1)",
    )
    parser.add_argument("--profile", type=Path, default=None, help="py-spy output directory")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    print(f"load average at start: {m.load_average()}", flush=True)
    results = {}
    granularities = ("server", "card") if args.granularity == "both" else (args.granularity,)
    admissions = ("gate", "filter") if args.admission == "both" else (args.admission,)
    for granularity in granularities:
        for admission in admissions:
            key = f"{granularity}/{admission}"
            # uvloop, as the services and `python -m rgpu_kubesim serve` run: the simulation's
            # own CPU is measured on the loop it is meant to run on.
            results[key] = anyio.run(
                run, args, granularity, admission, backend_options={"use_uvloop": True}
            )
            report.show(key, results[key])
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
