"""Discovery service: fleet build, one node event, and long-poll fan-out, beside the targets.

Run: ``python3 -m uv run --no-sync python bench/bench_discovery.py [--servers 5000] [--cards 8]``

Figures (medians over rounds unless said otherwise):

* fleet build               - a full Node list of N servers x C cards plus the client nodes
  (raw dicts, as the watch gets them) applied to a fresh catalog: views, register decode,
  ``Server`` build, per-server JSON, topology; then the first ``GET /v1/fleet`` body
* node event, relevant      - one MODIFIED server Node that flips Ready, on the full fleet:
  view, rebuild of that server, compare, publish (what the watch does per event)
* node event, irrelevant    - one MODIFIED server Node whose change is not allocation-relevant
  (a heartbeat-like label); compared and dropped, no publish
* node event, client node   - one MODIFIED client Node (topology side), relevant change
* long-poll fan-out         - W waiters parked on ``GET /v1/fleet?since=R&wait=30`` against the
  real app under uvicorn (httptools, uvloop), with the simulated apiserver in the same process;
  one Node is patched in the apiserver and the time from the patch to each complete answer is
  measured (median and slowest), once with gzip (what httpx and aiohttp clients ask for by
  default) and once with ``identity``. Bodies are read as sent: decompressing is the
  clients' CPU, not discovery's. Apiserver, app and waiters share one event loop here.
* fleet update per follower - one server flips Ready on a fleet of ``--updates-servers``
  (1,000) servers: the bytes one follower downloads and the CPU it spends taking the change,
  before (the whole ``Fleet``: gunzip, JSON, ``Fleet.from_dict``) and after (``delta=1``: the
  ``FleetUpdate`` of that server, JSON, ``from_dict``, ``apply`` to the fleet held), medians
  over ``--changes`` changes, in CPU time of the process (the machine is shared); plus
  discovery's own cost of the delta body, once per change
  however many followers ask. The same for the allocator's claim set (one claim per server,
  one Lease changes): the whole ``ClaimSet`` against the ``ClaimsUpdate`` of that server.
  ``--updates-only`` prints just this section.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import orjson
from anyio.abc import ByteStream

from rgpu_allocator.claims import LeaseRecord
from rgpu_allocator.published import PublishedClaims
from rgpu_contracts import ClaimSet, ClaimsUpdate, Fleet, FleetUpdate, ServerName
from rgpu_discovery import create_app
from rgpu_discovery.fleet import FleetState
from rgpu_discovery.nodes import NodeNotices
from rgpu_discovery.settings import DiscoverySettings
from rgpu_discovery.topology import TopologyState
from rgpu_discovery.watching import Catalog
from rgpu_kubesim import run_apiserver, run_lupine
from rgpu_runtime.kube import ObjectChange
from rgpu_runtime.serving import Listener, running
from rgpu_testkit import claim, pod_ref

BUILD_TARGET_S = 1.0
EVENT_TARGET_MS = 1.0
FANOUT_TARGET_MS = 100.0
"""The long-poll rule: a waiter is answered within 100 ms of a change."""
UPDATE_BYTES_TARGET = 4096
"""One server changed: one server's JSON (8 cards are about 2.5 KB) plus the envelope; the
whole fleet is what every follower downloaded before."""
UPDATE_CPU_TARGET_MS = 1.0
"""Per follower per one-server change; profiles at 1,000 servers showed metrics spending
67 % of its CPU decoding whole fleets, about 40 ms per change."""

KEYS = ("topology.rgpu.io/rack", "topology.kubernetes.io/zone", "topology.kubernetes.io/region")


def server_node(index: int, cards: int, ready: str = "True", extra: str = "") -> dict[str, Any]:
    """A server Node as a kubelet and HAMi's device plugin leave it (register annotation)."""
    name = f"gpu-{index:05d}"
    register = [
        {
            "id": f"GPU-{index:05d}-{c:02d}-7f2c1a9e-0b1d-4e55-9a77",
            "index": c,
            "count": 10,
            "devmem": 81920,
            "devcore": 100,
            "type": "NVIDIA-A100-SXM4-80GB",
            "numa": c // 4,
            "mode": "remote",
            "health": True,
        }
        for c in range(cards)
    ]
    labels = {
        "hami.io/lupine-server": "",
        "kubernetes.io/hostname": name,
        KEYS[0]: f"rack-{index % 40}",
        KEYS[1]: f"zone-{index % 4}",
        KEYS[2]: "sim-1",
        "heartbeat": extra,
    }
    return node(
        name,
        labels,
        {"hami.io/node-nvidia-register": json.dumps(register)},
        f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}",
        ready,
    )


def client_node(index: int, zone: str = "") -> dict[str, Any]:
    name = f"node-{index:05d}"
    labels = {
        "kubernetes.io/hostname": name,
        KEYS[0]: f"rack-{index % 40}",
        KEYS[1]: zone or f"zone-{index % 4}",
        KEYS[2]: "sim-1",
    }
    return node(name, labels, {}, f"10.200.{index // 256 % 256}.{index % 256}", "True")


def node(
    name: str, labels: dict[str, str], annotations: dict[str, str], ip: str, ready: str
) -> dict[str, Any]:
    conditions = [{"type": t, "status": "False"} for t in ("MemoryPressure", "DiskPressure")]
    conditions.append({"type": "Ready", "status": ready, "reason": "KubeletReady"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": labels,
            "annotations": annotations,
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ],
            "conditions": conditions,
        },
    }


def fresh_catalog() -> Catalog:
    notices = NodeNotices(default_port=14833, emit=lambda event: None)
    return Catalog(
        fleet=FleetState(default_port=14833),
        topology=TopologyState(),
        notices=notices,
        topology_keys=KEYS,
    )


def bench_build(nodes: Sequence[dict[str, Any]], rounds: int) -> tuple[float, float]:
    builds, bodies = [], []
    for _ in range(rounds):
        catalog = fresh_catalog()
        started = time.perf_counter()
        catalog.relist(nodes)
        built = time.perf_counter()
        catalog.fleet.snapshot().body()
        builds.append(built - started)
        bodies.append(time.perf_counter() - built)
    return statistics.median(builds), statistics.median(bodies)


def bench_events(catalog: Catalog, make: Callable[[int], dict[str, Any]], count: int) -> float:
    events = [make(i) for i in range(count)]
    times = []
    for event in events:
        started = time.perf_counter()
        catalog.observe("MODIFIED", event)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateCost:
    """Per follower per one-server change: bytes on the wire and CPU to take it."""

    full_bytes: float
    full_gzip_bytes: float
    full_ms: float
    delta_bytes: float
    delta_ms: float
    serve_delta_ms: float


def bench_updates(servers: int, cards: int, changes: int) -> UpdateCost:
    """One server flips Ready per change; a follower takes each change whole, or as a delta."""
    catalog = fresh_catalog()
    catalog.relist([server_node(i, cards) for i in range(servers)])
    held = Fleet.from_dict(orjson.loads(catalog.fleet.snapshot().body()))
    rows: list[tuple[float, float, float, float, float, float]] = []
    for i in range(changes):
        since = catalog.fleet.snapshot().revision
        catalog.observe(
            "MODIFIED", server_node(i % servers, cards, ("False", "True")[i // servers % 2])
        )
        snapshot = catalog.fleet.snapshot()
        started = time.process_time()
        delta = snapshot.update(since)
        served = time.process_time()
        update = FleetUpdate.from_dict(orjson.loads(delta))
        taken = update.apply(held)
        applied = time.process_time()
        whole = snapshot.gzipped()
        decoded = time.process_time()
        full = Fleet.from_dict(orjson.loads(gzip.decompress(whole)))
        done = time.process_time()
        assert taken == full, "a delta applied must equal the whole fleet"
        held = taken
        rows.append(
            (
                len(snapshot.body()),
                len(whole),
                done - decoded,
                len(delta),
                applied - served,
                served - started,
            )
        )
    return _cost(rows)


def lease(server: str, index: int, cards: int, version: int) -> LeaseRecord:
    held = claim(server=server, cards=range(cards), pod=pod_ref(name=f"pod-{index}-{version}"))
    return LeaseRecord(
        name=f"rgpu-{server}",
        server=ServerName(server),
        resource_version=str(version),
        claims=(held,),
    )


def bench_claim_updates(servers: int, cards: int, changes: int) -> UpdateCost:
    """One claim Lease changes per change; a follower takes it whole, or as a delta."""
    published = PublishedClaims()
    names = [f"gpu-{i:05d}" for i in range(servers)]
    published.relisted({n: lease(n, i, cards, 1) for i, n in enumerate(names)}, "10")
    held = ClaimSet.from_dict(orjson.loads(published.versioned.value.body()))
    rows: list[tuple[float, float, float, float, float, float]] = []
    for i in range(changes):
        since, name = held.revision, names[i % servers]
        after = lease(name, i, cards, 11 + i)
        published.changed(
            ObjectChange(type="MODIFIED", before=None, after=after, resource_version=str(11 + i))
        )
        snapshot = published.versioned.value
        started = time.process_time()
        delta = snapshot.update(since)
        served = time.process_time()
        taken = ClaimsUpdate.from_dict(orjson.loads(delta)).apply(held)
        applied = time.process_time()
        whole = gzip.compress(snapshot.body(), compresslevel=3)
        decoded = time.process_time()
        full = ClaimSet.from_dict(orjson.loads(gzip.decompress(whole)))
        done = time.process_time()
        assert taken == full, "a delta applied must equal the whole claim set"
        held = taken
        rows.append(
            (
                len(snapshot.body()),
                len(whole),
                done - decoded,
                len(delta),
                applied - served,
                served - started,
            )
        )
    return _cost(rows)


def _cost(rows: list[tuple[float, float, float, float, float, float]]) -> UpdateCost:
    columns = [statistics.median(column) for column in zip(*rows, strict=True)]
    return UpdateCost(
        full_bytes=columns[0],
        full_gzip_bytes=columns[1],
        full_ms=columns[2] * 1000,
        delta_bytes=columns[3],
        delta_ms=columns[4] * 1000,
        serve_delta_ms=columns[5] * 1000,
    )


def print_updates(servers: int, cards: int, changes: int) -> None:
    cost = bench_updates(servers, cards, changes)
    print(f"fleet update per follower: one server changes, {servers} servers x {cards} cards")
    print_cost(cost, "discovery")
    cost = bench_claim_updates(servers, cards, changes)
    print(f"claim set update per follower: one Lease changes, {servers} servers, one claim each")
    print_cost(cost, "allocator")


def print_cost(cost: UpdateCost, publisher: str) -> None:
    byte_target = f"<= {UPDATE_BYTES_TARGET} B"
    cpu_target = f"<= {UPDATE_CPU_TARGET_MS:g} ms"
    row("before: bytes (the whole set, identity)", f"{cost.full_bytes / 1e3:.0f} KB", byte_target)
    row("before: bytes (the whole set, gzip)", f"{cost.full_gzip_bytes / 1e3:.0f} KB", byte_target)
    row("before: follower CPU (gunzip + decode)", f"{cost.full_ms:.2f} ms", cpu_target)
    row("after: bytes (delta=1, one server)", f"{cost.delta_bytes:.0f} B", byte_target)
    row("after: follower CPU (decode + apply)", f"{cost.delta_ms:.3f} ms", cpu_target)
    row(
        f"after: {publisher} CPU per change (delta body)",
        f"{cost.serve_delta_ms:.3f} ms",
        "none (once per change)",
    )


async def bench_fanout(servers: int, cards: int, waiters: int) -> list[FanOut]:
    """Fan-out with gzip (what clients get by default) and without, on one running app."""
    async with run_apiserver() as sim:
        for i in range(servers):
            sim.store.create("nodes", server_node(i, cards))
        env = {"RGPU_KUBE_URL": sim.url, "RGPU_PROBE_INTERVAL_SECONDS": "3600"}
        settings = DiscoverySettings.from_env(env | {"RGPU_TOPOLOGY_KEYS": ",".join(KEYS)})
        # Every probe reaches one fake lupine that reports no clients: the fan-out is measured.
        async with run_lupine() as lupine:

            async def dial(host: str, port: int) -> ByteStream:
                return await anyio.connect_tcp(lupine.host, lupine.port)

            return await _fanouts(sim, create_app(settings, probe_dialer=dial), waiters)


async def _fanouts(sim: Any, app: Any, waiters: int) -> list[FanOut]:
    async with running(app, Listener(listen="127.0.0.1:0")) as (url,):
        return [
            await _fanout(sim, url, waiters, encoding, ready)
            for encoding, ready in (("gzip", "False"), ("identity", "True"))
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class FanOut:
    encoding: str
    median_ms: float
    slowest_ms: float
    wire_bytes: int


async def _fanout(sim: Any, url: str, waiters: int, encoding: str, ready: str) -> FanOut:
    # Clients are other processes in production; decompressing here would bill their CPU to
    # discovery, so bodies are read as sent.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        revision = await _settled_revision(session, url)
        done: list[tuple[float, int]] = []

        async def wait() -> None:
            params = {"since": str(revision), "wait": "30"}
            headers = {"Accept-Encoding": encoding}
            async with session.get(f"{url}/v1/fleet", params=params, headers=headers) as answer:
                body = await answer.read()
            done.append((time.perf_counter(), len(body)))

        async with anyio.create_task_group() as tg:
            for _ in range(waiters):
                tg.start_soon(wait)
            await anyio.sleep(1.0)
            changed = time.perf_counter()
            condition = {"type": "Ready", "status": ready, "reason": "Bench"}
            patch = {"status": {"conditions": [condition]}}
            sim.store.patch("nodes", "gpu-00000", patch, subresource="status")
    latencies = sorted((at - changed) * 1000 for at, _ in done)
    return FanOut(
        encoding=encoding,
        median_ms=statistics.median(latencies),
        slowest_ms=latencies[-1],
        wire_bytes=done[0][1],
    )


async def _settled_revision(session: aiohttp.ClientSession, url: str) -> int:
    """The fleet's revision once the first list and the first probe round are in."""
    revision = -1
    while True:
        try:
            async with session.get(f"{url}/v1/fleet", params=_poll(revision)) as response:
                if response.status == 503:
                    await anyio.sleep(0.1)
                    continue
                latest = int(response.headers["X-Rgpu-Revision"])
        except aiohttp.ClientError:
            await anyio.sleep(0.1)
            continue
        if latest == revision:
            return revision
        revision = latest


def _poll(revision: int) -> dict[str, str]:
    return {} if revision < 0 else {"since": str(revision), "wait": "2"}


def row(label: str, value: str, target: str) -> None:
    print(f"  {label:<52} {value:>9}   target {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=5000)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--waiters", type=int, default=50)
    parser.add_argument("--fanout-servers", type=int, default=5000)
    parser.add_argument("--updates-servers", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--updates-only", action="store_true")
    args = parser.parse_args()
    # The app logs each 503 it answers while the first list is pending; not a bench figure.
    logging.basicConfig(level=logging.ERROR)
    print_updates(args.updates_servers, args.cards, args.changes)
    if args.updates_only:
        return

    servers = [server_node(i, args.cards) for i in range(args.servers)]
    clients = [client_node(i) for i in range(args.clients)]
    print(f"discovery: {args.servers} servers x {args.cards} cards, {args.clients} client nodes")
    build, body = bench_build(servers + clients, args.rounds)
    row(
        "fleet build (list applied)", f"{build * 1000:.0f} ms", f"<= {BUILD_TARGET_S * 1000:.0f} ms"
    )
    row("first fleet body (sort + join)", f"{body * 1000:.0f} ms", "(part of the first GET)")

    catalog = fresh_catalog()
    catalog.relist(servers + clients)
    n = args.servers
    flip = bench_events(
        catalog,
        lambda i: server_node(i % n, args.cards, ("False", "True")[i // n % 2]),
        args.events,
    )
    same = bench_events(
        catalog, lambda i: server_node(i % n, args.cards, extra=str(i)), args.events
    )
    client = bench_events(
        catalog, lambda i: client_node(i % args.clients, zone=f"z{i}"), args.events
    )
    row(
        "node event, relevant (Ready flip)",
        f"{flip * 1e6:.0f} us",
        f"<= {EVENT_TARGET_MS * 1000:.0f} us",
    )
    row(
        "node event, irrelevant label",
        f"{same * 1e6:.0f} us",
        f"<= {EVENT_TARGET_MS * 1000:.0f} us",
    )
    row(
        "node event, client topology",
        f"{client * 1e6:.0f} us",
        f"<= {EVENT_TARGET_MS * 1000:.0f} us",
    )
    results = anyio.run(
        bench_fanout,
        args.fanout_servers,
        args.cards,
        args.waiters,
        backend_options={"use_uvloop": True},
    )
    print(f"long-poll fan-out: {args.waiters} waiters, {args.fanout_servers} servers")
    for result in results:
        size = f"{result.encoding}, {result.wire_bytes / 1e6:.2f} MB each"
        row(
            f"answer after change, median ({size})",
            f"{result.median_ms:.0f} ms",
            f"<= {FANOUT_TARGET_MS:.0f} ms",
        )
        row(
            f"answer after change, slowest ({result.encoding})",
            f"{result.slowest_ms:.0f} ms",
            f"<= {FANOUT_TARGET_MS:.0f} ms",
        )


if __name__ == "__main__":
    main()
