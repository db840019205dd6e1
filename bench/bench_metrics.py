"""Metrics service: scrape time and memory for a 10,000-card fleet, beside the targets.

Run: ``python3 -m uv run --no-sync python bench/bench_metrics.py [--cards 10000] [--rounds 30]``

Figures (medians unless said otherwise):

* scrape over loopback   - ``GET /metrics`` of the real app under uvicorn (httptools, uvloop),
  read whole by an aiohttp client, while nothing changed; also with OpenMetrics negotiated
* scrape, fleet changing 10x/s - the same while discovery answers every poll at once with a
  different fleet, so a 10,000-card fleet is decoded ten times a second beside the scrapes
  (the fastest the follower's minimum interval allows: the worst case)
* render, one claim moved - ``expose()`` (what the route does) right after the allocator
  published a claim set in which one claim changed state: the scrape under scheduling churn
* render, equal fleet re-sent - a freshly decoded fleet equal to the last (every quiet long-poll)
* render, from nothing   - every server rendered (start, or every server changed at once)
* not used: Collector   - the same card families built as ``GaugeMetricFamily`` objects in a
  custom Collector and formatted by prometheus_client's ``generate_latest``: the design this
  service does not use, measured so the choice stays honest
* memory                 - tracemalloc peak of the board (fleet, claims, rendered block) and RSS
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import httpx
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rgpu_contracts import ClaimSet, Fleet
from rgpu_metrics import FollowPolicy, create_app
from rgpu_metrics.board import Board
from rgpu_metrics.routes import expose
from rgpu_placement import CardState, claims_by_server, holding_claims, view_cards
from rgpu_runtime.serving import Listener, running
from rgpu_runtime.settings import Settings

SCRAPE_TARGET_MS = 50.0
MEMORY_TARGET_MB = 200.0
"""No memory target is written down; 200 MB is what a metrics pod with a 256 MiB limit can give
its snapshot while leaving room for the process and two scrapes in flight."""

CARDS_PER_SERVER = 8
STATES = ("booked", "committed", "bound")


def fleet_dict(cards: int, revision: int = 1) -> dict[str, object]:
    servers = []
    for s in range(cards // CARDS_PER_SERVER):
        name = f"gpu-node-{s:05d}"
        uuids = [f"GPU-{s:05d}-{c:02d}-1f2e3d4c-5b6a-7980-1234-56789abc" for c in range(8)]
        servers.append(
            {
                "name": name,
                "endpoint": f"10.{s // 250}.{s % 250}.10:14833",
                "port": 14833,
                "ready": s % 97 != 0,
                "reachable": True,
                "usageReported": True,
                "busy": [uuids[7]] if s % 5 == 0 else [],
                "topology": {"topology.rgpu.io/rack": f"rack-{s // 16}"},
                "cards": [
                    card_dict(name, uuid, c, healthy=c != 6 or s % 11)
                    for c, uuid in enumerate(uuids)
                ],
                "error": None,
            }
        )
    return {"revision": revision, "observedAt": 0.0, "servers": servers}


def card_dict(server: str, uuid: str, index: int, *, healthy: object) -> dict[str, object]:
    return {
        "id": f"{server}/{uuid}",
        "server": server,
        "uuid": uuid,
        "index": index,
        "memoryMiB": 81920,
        "cores": 100,
        "model": "NVIDIA H100 80GB HBM3",
        "numa": index // 4,
        "healthy": bool(healthy),
    }


def claims_dict(fleet: dict[str, object], revision: int = 1, moved: int = -1) -> dict[str, object]:
    """Claim three servers in four, whole server each (granularity ``server``)."""
    claims = []
    servers: list[dict[str, Any]] = fleet["servers"]  # type: ignore[assignment]
    for s, server in enumerate(servers):
        if s % 4 == 3:
            continue
        state = STATES[(s + (1 if s == moved else 0)) % 3]
        claims.append(
            {
                "pod": {"uid": f"uid-{s}", "namespace": f"team-{s % 20}", "name": f"train-{s}"},
                "server": server["name"],
                "cards": [card["id"] for card in server["cards"]],
                "containers": [],
                "state": state,
                "bookedAt": 1.0 + s,
                "committedAt": None,
                "node": None,
            }
        )
    return {"revision": revision, "claims": claims}


class _Peers:
    """The two sources as ``MockTransport`` handlers that answer at once (no long-poll hold).

    With ``alternate``, discovery answers two fleets (revisions 1 and 2) in turn, so every
    answer is a change the exporter must decode.
    """

    def __init__(
        self, fleet: dict[str, object], claims: dict[str, object], *, alternate: bool = False
    ) -> None:
        self.fleets = [
            orjson.dumps({**fleet, "revision": r}) for r in ((1, 2) if alternate else (1,))
        ]
        self.claims = orjson.dumps(claims)
        self.answered = 0

    def discovery(self, request: httpx.Request) -> httpx.Response:
        self.answered += 1
        return httpx.Response(200, content=self.fleets[self.answered % len(self.fleets)])

    def allocator(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=self.claims)


@asynccontextmanager
async def running_app(peers: _Peers, *, churn: bool = False) -> AsyncIterator[str]:
    """The real app under uvicorn (httptools) on an ephemeral loopback port; yields its URL."""
    settings = Settings.from_env(
        {"RGPU_DISCOVERY_URL": "http://discovery", "RGPU_ALLOCATOR_URL": "http://allocator"},
        service="metrics",
    )
    # The fake peers answer at once: a long minimum interval keeps their polls off the clock;
    # with ``churn`` the default policy polls as fast as it allows (ten times a second).
    app = create_app(
        settings,
        discovery_transport=httpx.MockTransport(peers.discovery),
        allocator_transport=httpx.MockTransport(peers.allocator),
        policy=FollowPolicy() if churn else FollowPolicy(min_interval_seconds=3600.0),
    )
    async with running(app, Listener(listen="127.0.0.1:0")) as (url,):
        async with aiohttp.ClientSession() as session:
            with anyio.fail_after(10):
                while not await _ready(session, url):  # noqa: ASYNC110 (polling a peer)
                    await anyio.sleep(0.01)
        yield url


async def _ready(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(f"{url}/readyz") as response:
        return response.status == 200


async def time_scrapes(url: str, rounds: int, accept: str = "") -> tuple[list[float], int]:
    """Scrape ``rounds`` times over loopback with aiohttp, reading each whole body."""
    times, size = [], 0
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        for _ in range(rounds):
            started = time.perf_counter()
            async with session.get(f"{url}/metrics", headers={"accept": accept}) as response:
                size = len(await response.read())
            times.append((time.perf_counter() - started) * 1000)
    return times, size


def timed(rounds: int, before: Callable[[], None], action: Callable[[], object]) -> list[float]:
    times = []
    for _ in range(rounds):
        before()
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return times


class _CardCollector(Collector):
    """The road not taken: card families as prometheus_client objects, formatted per scrape."""

    def __init__(self, fleet: Fleet, claims: ClaimSet) -> None:
        self.fleet, self.claims = fleet, claims

    def collect(self) -> Iterator[Metric]:
        hami = ("server", "endpoint", "device_uuid", "device_index", "device_type")
        memory = GaugeMetricFamily("hami_remote_gpu_memory_limit_bytes", "m", labels=hami)
        allocated = GaugeMetricFamily("hami_remote_gpu_allocated", "a", labels=hami)
        overview = GaugeMetricFamily(
            "hami_remote_gpu_overview", "o", labels=(*hami, "device_cores", "device_memory_limit")
        )
        state = GaugeMetricFamily("rgpu_card_state", "s", labels=("server", "card", "state"))
        groups = claims_by_server(self.claims)
        for server in self.fleet.servers:
            for view in view_cards(server, holding_claims(groups.get(server.name, ()))):
                card = view.card
                labels = (server.name, server.endpoint or "", card.id, str(card.index), "RemoteGPU")
                memory.add_metric(labels, card.memory_mib << 20)
                allocated.add_metric(labels, int(view.allocated))
                extra = (str(card.cores), str(card.memory_mib))
                overview.add_metric((*labels, *extra), (card.memory_mib << 20) * view.allocated)
                for s in CardState:
                    state.add_metric((server.name, card.id, s.value), int(s is view.state))
        yield from (memory, allocated, overview, state)


def report(name: str, times: Iterable[float], target: float | None = None) -> None:
    values = sorted(times)
    median = statistics.median(values)
    p90 = values[int(len(values) * 0.9) - 1] if len(values) >= 10 else values[-1]
    beside = (
        f"target <= {target:.0f} ms  {'OK' if median <= target else 'MISSED'}" if target else ""
    )
    print(f"{name:<34} median {median:8.2f} ms   p90 {p90:8.2f} ms   {beside}")


async def bench_scrapes(cards: int, rounds: int) -> None:
    fleet = fleet_dict(cards)
    claims = claims_dict(fleet)
    async with running_app(_Peers(fleet, claims)) as url:
        times, size = await time_scrapes(url, rounds)
        print(
            f"fleet: {cards} cards, {cards // CARDS_PER_SERVER} servers; body {size / 1e6:.1f} MB"
        )
        report("scrape over loopback, unchanged", times, SCRAPE_TARGET_MS)
        accept = "application/openmetrics-text; version=1.0.0"
        report(
            "scrape, OpenMetrics", (await time_scrapes(url, rounds, accept))[0], SCRAPE_TARGET_MS
        )
    peers = _Peers(fleet, claims, alternate=True)
    async with running_app(peers, churn=True) as url:
        times, _ = await time_scrapes(url, rounds)
        report("scrape, fleet changing 10x/s", times, SCRAPE_TARGET_MS)
        print(f"{'':<34} ({peers.answered} fleets of {cards} cards decoded meanwhile)")
    board = Board()
    board.set_fleet(Fleet.from_dict(fleet))
    board.set_claims(ClaimSet.from_dict(claims))
    registry = CollectorRegistry()
    expose(registry, board, "")
    moved = iter([ClaimSet.from_dict(claims_dict(fleet, r, moved=r)) for r in range(rounds)])
    times = timed(
        rounds, lambda: board.set_claims(next(moved)), lambda: expose(registry, board, "")
    )
    report("render, one claim moved", times, SCRAPE_TARGET_MS)
    fleets = iter([Fleet.from_dict(fleet) for _ in range(rounds)])
    report(
        "render, equal fleet re-sent",
        timed(rounds, lambda: board.set_fleet(next(fleets)), board.block),
    )
    few = max(3, rounds // 5)
    report("render, from nothing", timed(few, lambda: _fresh(board, fleet, claims), board.block))
    registry.register(_CardCollector(Fleet.from_dict(fleet), ClaimSet.from_dict(claims)))
    alternative = timed(few, lambda: None, lambda: generate_latest(registry))
    report("not used: Collector + generate_latest", alternative)


def _fresh(board: Board, fleet: dict[str, object], claims: dict[str, object]) -> None:
    board.__init__()  # type: ignore[misc]
    board.set_fleet(Fleet.from_dict(fleet))
    board.set_claims(ClaimSet.from_dict(claims))


def bench_memory(cards: int) -> None:
    fleet, claims = fleet_dict(cards), claims_dict(fleet_dict(cards))
    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    board = Board()
    board.set_fleet(Fleet.from_dict(fleet))
    board.set_claims(ClaimSet.from_dict(claims))
    board.block()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    size = board.block().size / 1e6
    held, verdict = current / 1e6, "OK" if current / 1e6 <= MEMORY_TARGET_MB else "MISSED"
    print(
        f"{'memory, board of ' + str(cards) + ' cards':<34} held {held:8.1f} MB   "
        f"peak {peak / 1e6:6.1f} MB   target <= {MEMORY_TARGET_MB:.0f} MB  {verdict}"
    )
    grew = (rss_after - rss_before) / 1e3
    print(f"{'':<34} (samples {size:.1f} MB of it; max RSS grew {grew:.1f} MB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    bench_memory(args.cards)
    anyio.run(bench_scrapes, args.cards, args.rounds, backend_options={"use_uvloop": True})


if __name__ == "__main__":
    main()
