"""Simulated apiserver capacity: seeding, create rate, full list and watch fan-out, beside targets.

Run: ``python3 -m uv run --no-sync python bench/bench_kubesim.py [--pods 100000] [--nodes 10000]``

The apiserver runs in this process (uvicorn, httptools, uvloop); the load runs in a separate
client process (this script with ``--role``, aiohttp), so client CPU does not share the
server's event loop. Figures (medians unless said otherwise):

* seed nodes, in process   - N Nodes through ``Store.create`` (validation, versions, events)
* create pods, HTTP        - P pods POSTed by 32 concurrent connections; pods/s overall
* full pod list, HTTP      - ``GET /api/v1/pods`` of all P pods: request to last byte (the
  server's figure), and with the client's ``orjson.loads`` of the body on top (GC paused)
* selector list, HTTP      - the same list with ``fieldSelector=spec.nodeName=`` (no match
  short-cut: every pod is examined)
* watch fan-out            - W watchers on all pods; one pod label patched at a time; time from
  sending the PATCH to the moment the last watcher has the event (median and p99)
* resident memory          - the server process's peak RSS with everything above loaded
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import anyio
import orjson

from rgpu_kubesim import SimApiServer, run_apiserver

SEED_TARGET_S = 5.0
CREATE_TARGET_PER_S = 1000.0
LIST_TARGET_S = 2.0
FANOUT_TARGET_MS = 100.0
RSS_TARGET_MB = 4096.0
NAMESPACES = 10
CONCURRENCY = 32


def pod_manifest(index: int) -> dict[str, Any]:
    """A realistic pod (about 1.2 kB as JSON), shaped like a remote-GPU workload."""
    name = f"trainer-{index}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "trainer", "shard": str(index % 16)},
            "annotations": {"hami.io/webhook-mutated": "true"},
        },
        "spec": {
            "schedulerName": "rgpu-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/ml/trainer:1.4",
                    "command": ["python", "train.py", "--epochs", "10"],
                    "env": [
                        {
                            "name": "LUPINE_SERVER",
                            "valueFrom": {
                                "fieldRef": {
                                    "fieldPath": "metadata.annotations['hami.io/lupine-endpoint']"
                                }
                            },
                        },
                        {
                            "name": "LUPINE_WORKLOAD_ID",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                        },
                    ],
                    "resources": {
                        "limits": {"nvidia.com/remote-gpu": "1", "memory": "2Gi"},
                        "requests": {"cpu": "500m", "memory": "2Gi"},
                    },
                }
            ],
        },
    }


def node_manifest(index: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"node-{index:05d}",
            "labels": {"topology.rgpu.io/rack": f"r{index % 40}"},
        },
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [
                {
                    "type": "InternalIP",
                    "address": f"10.{index // 65536}.{index // 256 % 256}.{index % 256}",
                }
            ],
        },
    }


# -- client roles (run in a separate process) --------------------------------------------------


async def role_create(url: str, pods: int, user: str) -> dict[str, Any]:
    bodies = [orjson.dumps(pod_manifest(i)) for i in range(pods)]
    failures = 0
    next_index = 0
    headers = {"Content-Type": "application/json"}
    if user:
        headers["X-Sim-User"] = user

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal failures, next_index
        while next_index < pods:
            index, next_index = next_index, next_index + 1
            path = f"{url}/api/v1/namespaces/ns-{index % NAMESPACES}/pods"
            async with session.post(path, data=bodies[index], headers=headers) as response:
                await response.read()
                failures += response.status != 201

    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(CONCURRENCY):
                tg.start_soon(worker, session)
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "failures": failures}


async def role_list(url: str, rounds: int, query: str) -> dict[str, Any]:
    transfer, decoded, items = [], [], 0
    async with aiohttp.ClientSession() as session:
        for _ in range(rounds):
            started = time.perf_counter()
            async with session.get(f"{url}/api/v1/pods{query}") as response:
                body = await response.read()
            transfer.append(time.perf_counter() - started)
            # The cyclic GC would rescan millions of fresh dicts during the decode; a client
            # loading a big list pauses it, so this measures the decode itself.
            gc.disable()
            items = len(orjson.loads(body)["items"])
            gc.enable()
            decoded.append(time.perf_counter() - started)
    return {"transfer": transfer, "decoded": decoded, "items": items, "bytes": len(body)}


async def role_watch(url: str, watchers: int, writes: int) -> dict[str, Any]:
    seen: dict[int, int] = {}
    done: dict[int, anyio.Event] = {}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        async with session.get(f"{url}/api/v1/pods?limit=1") as response:
            version = (await response.json())["metadata"]["resourceVersion"]
        ready = anyio.Event()
        opened = 0

        async def watch() -> None:
            nonlocal opened
            path = f"{url}/api/v1/pods?watch=1&resourceVersion={version}"
            async with session.get(path) as stream:
                opened += 1
                if opened == watchers:
                    ready.set()
                async for line in stream.content:
                    rv = int(orjson.loads(line)["object"]["metadata"]["resourceVersion"])
                    seen[rv] = seen.get(rv, 0) + 1
                    if seen[rv] == watchers and rv in done:
                        done[rv].set()

        latencies = []
        async with anyio.create_task_group() as tg:
            for _ in range(watchers):
                tg.start_soon(watch)
            await ready.wait()
            await anyio.sleep(0.5)
            for index in range(writes):
                latencies.append(await _timed_patch(session, url, index, seen, done, watchers))
            tg.cancel_scope.cancel()
    return {"latencies": latencies}


async def _timed_patch(
    session: aiohttp.ClientSession,
    url: str,
    index: int,
    seen: dict[int, int],
    done: dict[int, anyio.Event],
    watchers: int,
) -> float:
    body = orjson.dumps({"metadata": {"labels": {"bench": str(index)}}})
    headers = {"Content-Type": "application/merge-patch+json"}
    started = time.perf_counter()
    path = f"{url}/api/v1/namespaces/ns-0/pods/trainer-0"
    async with session.patch(path, data=body, headers=headers) as response:
        rv = int((await response.json())["metadata"]["resourceVersion"])
    event = done.setdefault(rv, anyio.Event())
    if seen.get(rv, 0) < watchers:
        await event.wait()
    return time.perf_counter() - started


# -- orchestration (server process) ------------------------------------------------------------


async def _client(url: str, role: str, *args: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--role", role, "--url", url, *args]
    result = await anyio.run_process(command, stderr=None)
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def _seed_nodes(sim: SimApiServer, nodes: int) -> float:
    started = time.perf_counter()
    for index in range(nodes):
        sim.store.create("nodes", node_manifest(index))
    for index in range(NAMESPACES):
        sim.store.create("namespaces", {"metadata": {"name": f"ns-{index}"}})
    return time.perf_counter() - started


def _row(label: str, value: str, target: str, ok: bool | None) -> None:
    verdict = "" if ok is None else ("ok" if ok else "MISSED")
    print(f"{label:<40} {value:>22}   {target:<16} {verdict}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def _measure(args: argparse.Namespace) -> None:
    async with run_apiserver() as sim:
        seed = _seed_nodes(sim, args.nodes)
        _row(
            f"seed {args.nodes} nodes, in process",
            f"{seed:.2f} s",
            f"target < {SEED_TARGET_S:.0f} s",
            seed < SEED_TARGET_S,
        )
        created = await _client(sim.url, "create", "--pods", str(args.pods), "--user", args.user)
        rate = args.pods / created["seconds"]
        value = f"{rate:.0f}/s ({created['seconds']:.1f} s)"
        _row(
            f"create {args.pods} pods, HTTP",
            value,
            f"target >= {CREATE_TARGET_PER_S:.0f}/s",
            rate >= CREATE_TARGET_PER_S and not created["failures"],
        )
        await _report_lists(sim, args)
        fanout = await _client(
            sim.url, "watch", "--watchers", str(args.watchers), "--writes", str(args.writes)
        )
        latencies = sorted(fanout["latencies"])
        median, p99 = statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]
        value = f"{_ms(median)} (p99 {_ms(p99)})"
        _row(
            f"watch fan-out to {args.watchers}",
            value,
            f"target < {FANOUT_TARGET_MS:.0f} ms",
            median * 1000 < FANOUT_TARGET_MS,
        )
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        _row(
            "server peak RSS",
            f"{rss_mb:.0f} MB",
            f"target < {RSS_TARGET_MB:.0f} MB",
            rss_mb < RSS_TARGET_MB,
        )


async def _report_lists(sim: SimApiServer, args: argparse.Namespace) -> None:
    full = await _client(sim.url, "list", "--rounds", str(args.rounds))
    transfer, decoded = statistics.median(full["transfer"]), statistics.median(full["decoded"])
    label = f"full list {full['items']} pods"
    size = f"{full['bytes'] / 1e6:.0f} MB"
    target = f"target < {LIST_TARGET_S:.0f} s"
    _row(label, f"{transfer:.2f} s ({size})", target, transfer < LIST_TARGET_S)
    _row(f"{label} + client decode", f"{decoded:.2f} s", "(client's cost)", None)
    query = "?fieldSelector=spec.nodeName%3Dnowhere"
    selected = await _client(sim.url, "list", "--rounds", str(args.rounds), "--query", query)
    seconds = statistics.median(selected["transfer"])
    _row("field-selector list (0 match)", f"{seconds:.2f} s", target, seconds < LIST_TARGET_S)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--watchers", type=int, default=100)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--user", default="", help="create the pods as this user (authorized by RBAC: edit)"
    )
    parser.add_argument("--role", choices=["create", "list", "watch"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--query", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


async def _run_role(args: argparse.Namespace) -> dict[str, Any]:
    if args.role == "create":
        return await role_create(args.url, args.pods, args.user)
    if args.role == "list":
        return await role_list(args.url, args.rounds, args.query)
    return await role_watch(args.url, args.watchers, args.writes)


def main(argv: Sequence[str] = sys.argv[1:]) -> None:
    args = _parse(argv)
    options = {"use_uvloop": True}
    if args.role:
        print(json.dumps(anyio.run(_run_role, args, backend="asyncio", backend_options=options)))
        return
    print(f"kubesim bench: {args.pods} pods, {args.nodes} nodes, {args.watchers} watchers")
    anyio.run(_measure, args, backend="asyncio", backend_options=options)


if __name__ == "__main__":
    main()
