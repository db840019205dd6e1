"""Shared probes: one probe per server at a time, counted once, rate-limited for on-demand
callers only; lupine is a loopback server whose answers the test releases when it wants (the
prober's dialer sends every endpoint there)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketStream
from prometheus_client import CollectorRegistry

from rgpu_contracts.ids import ServerName
from rgpu_discovery.fleet import FleetState, ProbeReport
from rgpu_discovery.instruments import Instruments
from rgpu_discovery.lupine import LupineProber
from rgpu_discovery.probe_states import ProbeState, StampedState
from rgpu_discovery.probing import ProbeFlights, ProbeLoop
from rgpu_discovery.topology import TopologyState
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

GPU_A = ServerName("gpu-a")
ENDPOINT = "10.0.0.1:14833"
MOVED = "10.0.0.2:14833"
USAGE = 'lupine_client_device_memory_used_bytes{device_uuid="GPU-1"} 1024\n'


@dataclass(kw_only=True)
class Lupine:
    """A connection handler: counts connections, holds each until ``gate`` is set, then
    answers with ``USAGE`` (or hangs up without a byte when ``down``)."""

    gate: anyio.Event = field(default_factory=anyio.Event)
    down: bool = False
    requests: int = 0

    async def __call__(self, stream: SocketStream) -> None:
        self.requests += 1
        async with stream:
            await self.gate.wait()
            if self.down:
                return
            await stream.receive()
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(USAGE)}\r\n\r\n"
            await stream.send(head.encode() + USAGE.encode())


@asynccontextmanager
async def prober_for(lupine: Lupine, timeout: float) -> AsyncIterator[LupineProber]:
    """A prober whose every connection, whatever the endpoint, reaches ``lupine``."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(SocketAttribute.local_port)

    async def dial(host: str, _: int) -> SocketStream:
        return await anyio.connect_tcp("127.0.0.1", port)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, lupine)
        yield LupineProber(timeout=timeout, dialer=dial)
        tg.cancel_scope.cancel()


@dataclass
class Recorder:
    """Records results as a single replica's state Leases would, straight into the fleet
    (the apiserver path is tested in test_state_writer and test_sharding)."""

    fleet: FleetState
    version: int = 0

    async def __call__(self, report: ProbeReport) -> None:
        current = self.fleet.state(report.server)
        fresh = current is None or current.endpoint != report.endpoint
        base = ProbeState() if fresh or current is None else current.probe
        self.version += 1
        state = StampedState(
            server=report.server,
            endpoint=report.endpoint,
            probe=base.after(report.outcome),
            version=str(self.version),
            since=self.version,
            renewed_at=0.0,
            holder="test",
        )
        self.fleet.apply_states([state])


@dataclass(kw_only=True)
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, kw_only=True)
class Rig:
    fleet: FleetState
    flights: ProbeFlights
    lupine: Lupine
    clock: Clock

    def server(self):
        item = self.fleet.item(GPU_A)
        assert item is not None
        return item.value


@pytest.fixture
async def rig(build) -> AsyncIterator[Rig]:
    fleet = FleetState(default_port=14833)
    node = build.node("gpu-a", annotation=build.register(build.card("GPU-1")))
    fleet.replace_all([build.view(node)])
    instruments = Instruments.create(CollectorRegistry(), fleet, TopologyState())
    lupine, clock = Lupine(), Clock()
    async with prober_for(lupine, 5.0) as prober, anyio.create_task_group() as tg:
        flights = ProbeFlights(
            record=Recorder(fleet), prober=prober, instruments=instruments, clock=clock
        )
        await tg.start(flights.run)
        yield Rig(fleet=fleet, flights=flights, lupine=lupine, clock=clock)
        tg.cancel_scope.cancel()


Caller = Callable[[Rig], Awaitable[str]]


async def periodic(rig: Rig) -> str:
    """How the periodic loop asks: the probe runs in the caller's task."""
    return await rig.flights.probe_here(GPU_A, ENDPOINT)


async def on_demand(rig: Rig) -> str:
    return await rig.flights.reprobe(GPU_A, ENDPOINT, 0.25)


async def plain(rig: Rig) -> str:
    return await rig.flights.probe(GPU_A, ENDPOINT)


async def shared(rig: Rig, first: Caller, second: Caller) -> list[str]:
    """``first`` probes, ``second`` asks while it is in flight; then lupine answers."""
    outcomes: list[str] = []

    async def ask(caller: Caller) -> None:
        outcomes.append(await caller(rig))

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, first)
            await anyio.sleep(0.02)
            tg.start_soon(ask, second)
            await anyio.sleep(0.02)
            rig.lupine.gate.set()
    return sorted(outcomes, key=["probed", "coalesced"].index)  # finishing order is the loop's


@pytest.mark.parametrize(
    ("first", "second"), [(periodic, on_demand), (periodic, plain), (on_demand, periodic)]
)
async def test_a_failure_shared_by_two_callers_counts_once(
    rig: Rig, first: Caller, second: Caller
) -> None:
    rig.lupine.down = True
    outcomes = await shared(rig, first, second)
    assert (outcomes, rig.lupine.requests) == (["probed", "coalesced"], 1)
    assert rig.server().reachable
    assert await rig.flights.probe(GPU_A, ENDPOINT) == "probed"
    assert not rig.server().reachable


async def test_shared_success_replaces_the_busy_set_for_both_callers(rig: Rig) -> None:
    revision = rig.fleet.snapshot().revision
    outcomes = await shared(rig, periodic, on_demand)
    assert outcomes == ["probed", "coalesced"]
    assert (rig.server().busy, rig.fleet.snapshot().revision) == ({"GPU-1"}, revision + 1)


async def test_reprobe_within_min_interval_is_rate_limited_until_it_passes(rig: Rig) -> None:
    rig.lupine.gate.set()
    assert await rig.flights.reprobe(GPU_A, ENDPOINT, 0.25) == "probed"
    rig.clock.now += 0.2
    assert await rig.flights.reprobe(GPU_A, ENDPOINT, 0.25) == "rate_limited"
    assert rig.lupine.requests == 1
    rig.clock.now += 0.05
    assert await rig.flights.reprobe(GPU_A, ENDPOINT, 0.25) == "probed"
    assert rig.lupine.requests == 2


async def test_periodic_probe_is_never_rate_limited(rig: Rig) -> None:
    rig.lupine.gate.set()
    assert await rig.flights.reprobe(GPU_A, ENDPOINT, 60) == "probed"
    assert await rig.flights.probe_here(GPU_A, ENDPOINT) == "probed"
    assert await rig.flights.reprobe(GPU_A, ENDPOINT, 60) == "rate_limited"
    assert rig.lupine.requests == 2


async def test_moved_endpoint_is_probed_again_at_once(rig: Rig) -> None:
    rig.lupine.gate.set()
    assert await rig.flights.reprobe(GPU_A, ENDPOINT, 60) == "probed"
    assert await rig.flights.reprobe(GPU_A, MOVED, 60) == "probed"
    assert rig.lupine.requests == 2


async def test_forgotten_server_is_no_longer_rate_limited(rig: Rig) -> None:
    rig.lupine.gate.set()
    assert await rig.flights.reprobe(GPU_A, ENDPOINT, 60) == "probed"
    rig.flights.retain([ServerName("gpu-b")])
    assert await rig.flights.reprobe(GPU_A, ENDPOINT, 60) == "probed"
    rig.flights.retain([GPU_A])
    assert await rig.flights.reprobe(GPU_A, ENDPOINT, 60) == "rate_limited"


async def given_up(rig: Rig, first: Caller, *, answer: bool) -> list[str]:
    """``first`` probes and gives up after 50 ms while an on-demand caller shares its probe;
    lupine answers then if ``answer``, else never; what the sharer got."""
    joined: list[str] = []

    async def join() -> None:
        joined.append(await on_demand(rig))

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            with anyio.move_on_after(0.05):
                tg.start_soon(join)
                await first(rig)
            if answer:
                rig.lupine.gate.set()
    return joined


async def test_caller_giving_up_does_not_strand_the_callers_sharing_its_probe(rig: Rig) -> None:
    assert await given_up(rig, on_demand, answer=True) == ["coalesced"]
    assert rig.server().busy == {"GPU-1"}


async def test_a_periodic_probe_cancelled_midway_releases_those_sharing_it(rig: Rig) -> None:
    joined = await given_up(rig, periodic, answer=False)
    # Released with the state as it was: the cancelled probe landed nothing.
    assert (joined, rig.lupine.requests, rig.server().busy) == (["coalesced"], 1, frozenset())
    rig.lupine.gate.set()
    assert await rig.flights.probe_here(GPU_A, ENDPOINT) == "probed"
    assert rig.server().busy == {"GPU-1"}


async def test_the_periodic_loop_probes_every_server_once_at_most_concurrency_at_once(
    build,
) -> None:
    fleet = FleetState(default_port=14833)
    names = [f"gpu-{i}" for i in range(10)]
    fleet.replace_all(
        [
            build.view(
                build.node(
                    name, ip=f"10.0.0.{i + 1}", annotation=build.register(build.card(f"GPU-{i}"))
                )
            )
            for i, name in enumerate(names)
        ]
    )
    instruments = Instruments.create(CollectorRegistry(), fleet, TopologyState())
    lupine = Lupine()
    async with prober_for(lupine, 5.0) as prober, anyio.create_task_group() as tg:
        flights = ProbeFlights(record=Recorder(fleet), prober=prober, instruments=instruments)
        await tg.start(flights.run)
        loop = ProbeLoop(fleet=fleet, flights=flights, interval=600, concurrency=3)
        await tg.start(loop.run)
        await eventually(lambda: lupine.requests == 3, timeout=2, what="three probes")
        await anyio.sleep(0.1)
        assert lupine.requests == 3  # the bound: the others wait for a free worker
        lupine.gate.set()
        await eventually(
            lambda: all(busy(fleet, name) for name in names), timeout=2, what="every server"
        )
        assert lupine.requests == 10
        tg.cancel_scope.cancel()


def busy(fleet: FleetState, name: str) -> bool:
    item = fleet.item(ServerName(name))
    return item is not None and bool(item.value.busy)


async def test_probe_before_run_is_a_clear_error() -> None:
    fleet = FleetState(default_port=14833)
    instruments = Instruments.create(CollectorRegistry(), fleet, TopologyState())
    async with LupineProber(timeout=1.0) as prober:
        flights = ProbeFlights(record=Recorder(fleet), prober=prober, instruments=instruments)
        with pytest.raises(RuntimeError, match=r"ProbeFlights\.run is not running"):
            await flights.probe(GPU_A, ENDPOINT)


@pytest.mark.parametrize(
    ("ask", "answer"),
    [
        ("probe", False),  # its probe is in run's task group, cancelled with it
        ("probe_here", True),  # its probe is in the caller's task and ends after run
    ],
)
async def test_a_probe_out_when_run_stops_is_released_and_raises_nothing(
    ask: str, answer: bool
) -> None:
    fleet = FleetState(default_port=14833)
    instruments = Instruments.create(CollectorRegistry(), fleet, TopologyState())
    lupine = Lupine()
    async with prober_for(lupine, 5.0) as prober:
        flights = ProbeFlights(record=Recorder(fleet), prober=prober, instruments=instruments)
        outcomes: list[str] = []

        async def wait() -> None:
            outcomes.append(await getattr(flights, ask)(GPU_A, ENDPOINT))

        with anyio.fail_after(2):
            async with anyio.create_task_group() as outer:
                async with anyio.create_task_group() as inner:
                    await inner.start(flights.run)
                    outer.start_soon(wait)
                    await anyio.sleep(0.02)
                    inner.cancel_scope.cancel()  # shutdown reaches run first
                if answer:
                    lupine.gate.set()
    assert (outcomes, lupine.requests) == (["probed"], 1)
