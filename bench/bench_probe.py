"""Lupine probes: what one probe costs discovery and the GPU host, beside the targets.

Run: ``python3 -m uv run --no-sync python bench/bench_probe.py [--servers 100,1000] [--rounds 3]``

The fake lupine servers run in a child process (uvloop), four in five as the released
HTTP/2-only build (reply, then reset) and one in five as a newer build with ``/metrics``, so
the figures below are discovery's own. For each fleet size N, discovery's prober probes every
server once per round, 64 at a time (as the probe loop does), for the given rounds:

* probe latency, median     - connect to verdict, per probe
* CPU per probe             - this process's CPU time over the rounds / probes (the target
  follows from "discovery <= 5 % of a core at rest, 1,000 servers every 15 s": 0.75 ms)
* connections per probe     - connections the fake servers accepted / probes (each is a
  process forked on a real GPU host): exactly 1
* failed probes             - probes of these healthy servers that did not count as an answer: 0
* CPU growth with N         - CPU per probe at the largest N / at the smallest: O(1) work per
  probe keeps it near 1, a pool scanned on every request makes it grow with N

With ``--baseline`` the previous prober's transport (one pooled httpx client, HTTP/1.1
``GET /metrics``) is measured on the newer builds alone, for comparison.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import anyio
import anyio.to_thread
import httpx

from rgpu_discovery.lupine import LupineProber
from rgpu_kubesim.lupine import LupineSpec, open_lupine_fleet

CPU_PER_PROBE_TARGET_MS = 0.75
CONNECTIONS_PER_PROBE_TARGET = 1.0
GROWTH_TARGET = 1.5
CONCURRENCY = 64
GPUS = tuple(f"GPU-{i}" for i in range(8))


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    label: str
    servers: int
    probes: int
    median_ms: float
    cpu_ms: float
    connections: float
    failures: int


def _serve_fleet(servers: int, sniff_only: bool, pipe: Connection) -> None:
    anyio.run(_fleet, servers, sniff_only, pipe, backend_options={"use_uvloop": True})


async def _fleet(servers: int, sniff_only: bool, pipe: Connection) -> None:
    async with open_lupine_fleet() as fleet:
        for i in range(servers):
            sniff = sniff_only or i % 5 == 0
            await fleet.start(
                LupineSpec(name=f"gpu-{i}", mode="sniff" if sniff else "h2only", gpus=GPUS)
            )
        pipe.send([lupine.endpoint for lupine in fleet])
        while await anyio.to_thread.run_sync(pipe.recv) == "count":
            pipe.send(sum(lupine.connections for lupine in fleet))


Probe = Callable[[str], Awaitable[tuple[bool, float]]]


async def _rounds(endpoints: Sequence[str], rounds: int, probe: Probe) -> tuple[list[float], int]:
    limiter = anyio.CapacityLimiter(CONCURRENCY)
    latencies: list[float] = []
    failures = 0

    async def one(endpoint: str) -> None:
        nonlocal failures
        async with limiter:
            answered, seconds = await probe(endpoint)
        latencies.append(seconds)
        failures += not answered

    for _ in range(rounds):
        async with anyio.create_task_group() as tg:
            for endpoint in endpoints:
                tg.start_soon(one, endpoint)
    return latencies, failures


async def _measure(label: str, servers: int, rounds: int, sniff_only: bool) -> Row:
    # A fresh interpreter: a forked child would inherit this process's running event loop.
    spawn = multiprocessing.get_context("spawn")
    parent, child = spawn.Pipe()
    process = spawn.Process(target=_serve_fleet, args=(servers, sniff_only, child))
    process.start()
    try:
        endpoints = await anyio.to_thread.run_sync(parent.recv)
        async with _prober(label) as probe:
            await _rounds(endpoints, 1, probe)  # warm-up: imports, caches; not counted
            before = await _accepted(parent)
            cpu = time.process_time()
            latencies, failures = await _rounds(endpoints, rounds, probe)
            cpu = time.process_time() - cpu
        accepted = await _accepted(parent) - before
    finally:
        parent.send("stop")
        process.join()
    return Row(
        label=label,
        servers=servers,
        probes=len(latencies),
        median_ms=statistics.median(latencies) * 1000,
        cpu_ms=cpu / len(latencies) * 1000,
        connections=accepted / len(latencies),
        failures=failures,
    )


async def _accepted(pipe: Connection) -> int:
    pipe.send("count")
    count: int = await anyio.to_thread.run_sync(pipe.recv)
    return count


class _prober:
    """The probe under test as ``(endpoint) -> (answered, seconds)``."""

    def __init__(self, label: str) -> None:
        self._baseline = label.startswith("httpx")
        self._client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=CONCURRENCY), timeout=2.0
        )
        self._prober = LupineProber(timeout=2.0)

    async def __aenter__(self) -> Probe:
        return self._httpx if self._baseline else self._lupine

    async def __aexit__(self, *exc_info: object) -> None:
        await self._client.aclose()

    async def _lupine(self, endpoint: str) -> tuple[bool, float]:
        outcome = await self._prober.probe(endpoint)
        return outcome.answered, outcome.seconds

    async def _httpx(self, endpoint: str) -> tuple[bool, float]:
        started = time.perf_counter()
        try:
            response = await self._client.get(f"http://{endpoint}/metrics")
        except httpx.HTTPError:
            return False, time.perf_counter() - started
        return response.status_code == 200, time.perf_counter() - started


def _print(rows: Sequence[Row]) -> None:
    for row in rows:
        print(f"{row.label}: {row.servers} servers, {row.probes} probes")
        print(f"  probe latency, median          {row.median_ms:8.2f} ms")
        print(
            f"  CPU per probe                  {row.cpu_ms:8.3f} ms   "
            f"target <= {CPU_PER_PROBE_TARGET_MS} ms"
        )
        print(
            f"  connections per probe          {row.connections:8.2f}      "
            f"target = {CONNECTIONS_PER_PROBE_TARGET:.0f}"
        )
        print(f"  failed probes                  {row.failures:8d}      target = 0")
    by_label: dict[str, list[Row]] = {}
    for row in rows:
        by_label.setdefault(row.label, []).append(row)
    for label, group in by_label.items():
        if len(group) > 1:
            growth = group[-1].cpu_ms / group[0].cpu_ms
            print(
                f"{label}: CPU per probe at {group[-1].servers} / at {group[0].servers} servers "
                f"{growth:5.2f}x   target <= {GROWTH_TARGET}x"
            )


async def _main(sizes: Sequence[int], rounds: int, baseline: bool) -> list[Row]:
    rows = [await _measure("prober", n, rounds, sniff_only=False) for n in sizes]
    if baseline:
        rows += [await _measure("httpx pool (previous)", n, rounds, sniff_only=True) for n in sizes]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="100,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", action="store_true", help="also measure the httpx pool")
    args = parser.parse_args()
    sizes = [int(n) for n in args.servers.split(",")]
    rows = anyio.run(_main, sizes, args.rounds, args.baseline, backend_options={"use_uvloop": True})
    _print(rows)


if __name__ == "__main__":
    main()
