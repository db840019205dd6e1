"""A server's Node says it exists; only its lupine port says whether it is alive and which
GPUs already have clients. Every listed server is probed once per interval, concurrently but
bounded, and a server that just appeared (or moved) is probed at once rather than an interval
later, so a new server's busy set is known before anyone is placed on it (``ProbeLoop``).

Busy sets learned once per interval (15 s by default) go stale: when a holder pod finishes
and its lupine client disconnects, discovery keeps reporting its cards busy until the next
round, and the allocator would refuse the next pod for up to an interval. No refusal may be
stale (docs/design.md#no-stale-refusals), so before refusing the allocator asks discovery to
probe that one server now (``Reprober``). An on-demand probe is the periodic probe (same
code, same rules), so its result moves the fleet's revision exactly as a periodic one would,
and long-poll waiters see it at once. A burst of refusals must not hammer a lupine server: a
server probed less than ``min_interval`` ago is not probed again (the answer is the current
state), and concurrent requests share the probe in flight.

One probe must never count twice (two counted failures make a server unreachable), so every
probe, whoever asked, goes through ``ProbeFlights``: while a probe of a server is in flight,
any other caller for that server waits for it instead of probing again, and its result is
recorded exactly once — written to the server's state Lease (``state_writer``), from which
every replica's fleet, this one's included, takes it. The schedule of rounds never moves
because of on-demand probes. Probes run in the flights' own task group, which the lifespan
owns, not in the caller's task: a caller that gives up (an HTTP client hanging up) never
strands those sharing its probe, nor leaves a half-counted result. Results are recorded in
batches — whatever finished together is written together, concurrently.

With several replicas, the periodic loop probes only the servers this replica owns
(``sharding``); an on-demand probe is served by whichever replica received it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from opentelemetry import trace

from rgpu_contracts.fleet import Server
from rgpu_contracts.ids import ServerName
from rgpu_runtime.feeds import Entry

from .errors import NoEndpoint, NotListedYet, UnknownServer
from .fleet import FleetState, ProbeReport
from .instruments import Instruments, OnDemandOutcome
from .lupine import LupineProber, ProbeOutcome
from .versions import Versions

__all__ = ["REPROBE_MIN_INTERVAL", "ProbeFlights", "ProbeLoop", "Reprobed", "Reprober"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

REPROBE_MIN_INTERVAL: Final = 0.25
"""Seconds a server's last probe stays fresh enough to answer with. A healthy lupine answers
in about a millisecond, so four probes a second per server is nothing to it, while a burst of
refusals for one server (every pending pod retried at once) still costs one probe."""

Targets = dict[ServerName, str]
_NOTEWORTHY = frozenset({"http_error", "bad_body", "timeout", "refused", "unreachable"})


class _Flight:
    """One probe of one endpoint, from launch until its result is in the fleet."""

    __slots__ = ("applied", "endpoint", "landed_at")

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.applied = anyio.Event()
        self.landed_at: float | None = None

    def in_flight_to(self, endpoint: str) -> bool:
        """Whether this probe of ``endpoint`` is still running or not yet applied."""
        return self.endpoint == endpoint and not self.applied.is_set()

    def landed_within(self, endpoint: str, seconds: float, now: float) -> bool:
        """Whether this probe of ``endpoint`` was applied less than ``seconds`` before ``now``."""
        landed = self.landed_at
        return self.endpoint == endpoint and landed is not None and now - landed < seconds


Landed = tuple[_Flight, ProbeReport]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Running:
    tg: TaskGroup
    send: MemoryObjectSendStream[Landed]


Record = Callable[[ProbeReport], Awaitable[None]]
"""Takes one probe result where the fleet will see it (``StateWriter.record``)."""


class ProbeFlights:
    """Probes servers for every caller, one probe per server at a time; ``run`` must be running.

    ``record`` takes each result; ``clock`` (seconds, monotonic) dates each recorded result,
    for ``reprobe``'s rate limit; ``versions``, when given, adds the CUDA version to the
    probes it is due for.
    """

    def __init__(
        self,
        *,
        record: Record,
        prober: LupineProber,
        instruments: Instruments,
        clock: Callable[[], float] = anyio.current_time,
        versions: Versions | None = None,
    ) -> None:
        self._record = record
        self._prober = prober
        self._instruments = instruments
        self._clock = clock
        self._versions = versions
        # The latest probe of each server, in flight or landed: whom to join, when last probed.
        self._flights: dict[ServerName, _Flight] = {}
        # Every probe not yet applied, including any whose server moved or left since.
        self._airborne: set[_Flight] = set()
        self._running: _Running | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the probes and fold their results into the fleet, until cancelled."""
        send, receive = anyio.create_memory_object_stream[Landed](math.inf)
        try:
            # Streams outermost: they must stay open while the task group waits on its tasks.
            async with send, receive, anyio.create_task_group() as tg:
                self._running = _Running(tg=tg, send=send)
                tg.start_soon(self._apply, receive)
                task_status.started()
        finally:
            self._running = None
            self._release_waiters()

    async def probe(self, server: ServerName, endpoint: str) -> OnDemandOutcome:
        """Probe ``server`` at ``endpoint``, or share the probe of it already in flight.

        Returns once the result is in the fleet (or ``run`` stopped): ``probed`` when this
        call started the probe, ``coalesced`` when it shared one. Raises ``RuntimeError`` when
        ``run`` is not running.
        """
        flight = self._joinable(server, endpoint)
        outcome: OnDemandOutcome = "coalesced"
        if flight is None:
            flight = self._launch(server, endpoint)
            outcome = "probed"
        await flight.applied.wait()
        return outcome

    async def reprobe(
        self, server: ServerName, endpoint: str, min_interval: float
    ) -> OnDemandOutcome:
        """Like ``probe``, but answers ``rate_limited`` at once, without probing, when a probe
        of ``endpoint`` was applied less than ``min_interval`` seconds ago."""
        flight = self._flights.get(server)
        if flight is not None and flight.landed_within(endpoint, min_interval, self._clock()):
            return "rate_limited"
        return await self.probe(server, endpoint)

    def retain(self, servers: Iterable[ServerName]) -> None:
        """Forget the probe history of every server not in ``servers`` (gone from the fleet)."""
        gone = self._flights.keys() - set(servers)
        for name in gone:
            del self._flights[name]
        self._instruments.forget(gone)
        if self._versions is not None:
            self._versions.retain(self._flights)

    async def probe_here(self, server: ServerName, endpoint: str) -> OnDemandOutcome:
        """Like ``probe``, but a probe this call starts runs in the caller's task.

        For the periodic loop, which gives up only at shutdown: a task per probe was a fifth
        of discovery's CPU at rest. Should the caller be cancelled mid-probe all the same,
        those sharing its probe are answered with the state as it is, as at shutdown.
        """
        flight = self._joinable(server, endpoint)
        if flight is not None:
            await flight.applied.wait()
            return "coalesced"
        running = self._require_running()
        flight = self._board(server, endpoint)
        try:
            await self._fly(server, flight, running.send)
        except BaseException:
            self._ground(flight)
            raise
        await flight.applied.wait()
        return "probed"

    def _joinable(self, server: ServerName, endpoint: str) -> _Flight | None:
        flight = self._flights.get(server)
        return flight if flight is not None and flight.in_flight_to(endpoint) else None

    def _launch(self, server: ServerName, endpoint: str) -> _Flight:
        running = self._require_running()
        flight = self._board(server, endpoint)
        running.tg.start_soon(self._fly, server, flight, running.send)
        return flight

    def _require_running(self) -> _Running:
        if self._running is None:
            raise RuntimeError("ProbeFlights.run is not running: start it in the lifespan first")
        return self._running

    def _board(self, server: ServerName, endpoint: str) -> _Flight:
        flight = _Flight(endpoint)
        self._flights[server] = flight
        self._airborne.add(flight)
        return flight

    def _ground(self, flight: _Flight) -> None:
        """A probe that will never land: release whoever waits for it."""
        flight.applied.set()
        self._airborne.discard(flight)

    async def _fly(
        self, server: ServerName, flight: _Flight, send: MemoryObjectSendStream[Landed]
    ) -> None:
        with tracer.start_as_current_span("discovery.lupine.probe") as span:
            span.set_attribute("rgpu.server", server)
            span.set_attribute("rgpu.endpoint", flight.endpoint)
            outcome = await self._prober.probe(flight.endpoint)
            if self._versions is not None:
                outcome = await self._versions.after_probe(server, flight.endpoint, outcome)
            span.set_attribute("rgpu.probe.result", outcome.result)
            span.set_attribute("rgpu.probe.connections", outcome.connections)
            self._instruments.probed(server, outcome)
        _log(server, flight.endpoint, outcome)
        report = ProbeReport(server=server, endpoint=flight.endpoint, outcome=outcome)
        try:
            send.send_nowait((flight, report))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            # ``run`` stopped while a probe in a caller's task was out (shutdown): nothing
            # will land it, and a probe's end must not raise into the periodic loop.
            self._ground(flight)

    async def _apply(self, receive: MemoryObjectReceiveStream[Landed]) -> None:
        async for first in receive:
            async with anyio.create_task_group() as tg:
                for flight, report in (first, *_drain(receive)):
                    tg.start_soon(self._land, flight, report)

    async def _land(self, flight: _Flight, report: ProbeReport) -> None:
        await self._record(report)
        flight.landed_at = self._clock()
        flight.applied.set()
        self._airborne.discard(flight)

    def _release_waiters(self) -> None:
        # At shutdown a probe may never land; its waiters answer with the state as it is.
        for flight in list(self._airborne):
            self._ground(flight)


def _drain(receive: MemoryObjectReceiveStream[Landed]) -> Iterator[Landed]:
    while True:
        try:
            yield receive.receive_nowait()
        except anyio.WouldBlock:
            return


def _log(server: ServerName, endpoint: str, outcome: ProbeOutcome) -> None:
    if outcome.result in _NOTEWORTHY:
        logger.debug(
            "probe of %s: %s (%s)", endpoint, outcome.result, outcome.detail, extra={"node": server}
        )


class ProbeLoop:
    """Probes the servers this replica ``owns`` every ``interval`` seconds, at most
    ``concurrency`` at once, from when ``settled`` is set; ``fleet.targets_changed`` wakes it
    (new servers, ring changes)."""

    def __init__(
        self,
        *,
        fleet: FleetState,
        flights: ProbeFlights,
        interval: float,
        owns: Callable[[ServerName], bool] = lambda _: True,
        settled: anyio.Event | None = None,
        concurrency: int = 64,
    ) -> None:
        self._fleet = fleet
        self._owns = owns
        self._settled = settled
        self._flights = flights
        self._interval = interval
        self._concurrency = concurrency
        # Which endpoint of each server this loop last probed, to spot new or moved ones.
        self._dispatched: Targets = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Probe until cancelled (``ProbeFlights.run`` must be running)."""
        task_status.started()
        await self._schedule()

    async def _schedule(self) -> None:
        if self._settled is not None:
            # Who owns what is known only once the other replicas are listed.
            await self._settled.wait()
        next_round = anyio.current_time()
        seen = self._fleet.targets_changed.revision
        while True:
            timeout = max(0.0, next_round - anyio.current_time())
            seen, _ = await self._fleet.targets_changed.wait_newer(seen, timeout)
            targets = {n: e for n, e in self._fleet.targets().items() if self._owns(n)}
            if anyio.current_time() >= next_round:
                next_round = anyio.current_time() + self._interval
                batch = targets
                self._dispatched = dict(targets)
                self._flights.retain(self._fleet.targets())
            else:
                batch = {n: e for n, e in targets.items() if self._dispatched.get(n) != e}
                self._dispatched = {n: e for n, e in self._dispatched.items() if n in targets}
                self._dispatched.update(batch)
            if batch:
                await self._probe_all(batch)

    async def _probe_all(self, batch: Targets) -> None:
        # ``concurrency`` workers sharing one iterator, not a task per server behind a
        # limiter: the bound is the same, the per-probe task and lock were not free.
        targets = iter(batch.items())
        async with anyio.create_task_group() as tg:
            for _ in range(min(self._concurrency, len(batch))):
                tg.start_soon(self._work, targets)

    async def _work(self, targets: Iterator[tuple[ServerName, str]]) -> None:
        for server, endpoint in targets:
            await self._flights.probe_here(server, endpoint)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reprobed:
    """What the fleet says about one server once an on-demand probe request was served."""

    outcome: OnDemandOutcome
    revision: int
    """The fleet's revision right after the probe's result was applied."""
    server: Entry[Server]
    """The server as published in that revision, with its JSON."""


class Reprober:
    """Serves on-demand probe requests by server name."""

    def __init__(
        self,
        *,
        fleet: FleetState,
        flights: ProbeFlights,
        instruments: Instruments,
        min_interval: float = REPROBE_MIN_INTERVAL,
    ) -> None:
        self._fleet = fleet
        self._flights = flights
        self._instruments = instruments
        self._min_interval = min_interval

    async def reprobe(self, name: str) -> Reprobed:
        """Probe server ``name`` now (or share or skip, see the module), then report it.

        Raises ``NotListedYet`` before the first Node list, ``UnknownServer`` when the fleet
        has no server ``name`` (also when it left during the probe) and ``NoEndpoint`` when
        the server has no lupine endpoint.
        """
        server = ServerName(name)
        endpoint = self._endpoint(server)
        outcome = await self._flights.reprobe(server, endpoint, self._min_interval)
        self._instruments.requested(outcome)
        item = self._fleet.item(server)
        if item is None:
            raise UnknownServer(name)
        return Reprobed(outcome=outcome, revision=self._fleet.snapshot().revision, server=item)

    def _endpoint(self, server: ServerName) -> str:
        if not self._fleet.snapshot().listed:
            raise NotListedYet("fleet")
        item = self._fleet.item(server)
        if item is None:
            raise UnknownServer(server)
        if item.value.endpoint is None:
            raise NoEndpoint(server, item.value.error)
        return item.value.endpoint
