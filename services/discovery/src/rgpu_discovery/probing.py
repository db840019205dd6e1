"""Why this module exists: a server's Node says it exists; only its lupine port says whether it
is alive and which GPUs already have clients. Every listed server is probed once per interval,
concurrently but bounded, and a server that just appeared (or moved) is probed at once rather
than an interval later, so a new server's busy set is known before anyone is placed on it.

Results are folded into the fleet in batches — whatever arrived together is applied together —
so a probe round over thousands of servers publishes a handful of revisions, not thousands.
"""

from __future__ import annotations

import logging
import math

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from opentelemetry import trace

from rgpu_contracts.ids import ServerName

from .fleetstate import FleetState, ProbeReport
from .instruments import Instruments
from .lupine import LupineProber

__all__ = ["ProbeLoop"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

Targets = dict[ServerName, str]
_NOTEWORTHY = frozenset({"http_error", "bad_body", "timeout", "refused", "unreachable"})


class ProbeLoop:
    """Probes the fleet's servers every ``interval`` seconds, at most ``concurrency`` at once."""

    def __init__(
        self,
        *,
        fleet: FleetState,
        prober: LupineProber,
        instruments: Instruments,
        interval: float,
        concurrency: int = 64,
    ) -> None:
        self._fleet = fleet
        self._prober = prober
        self._instruments = instruments
        self._interval = interval
        self._limiter = anyio.CapacityLimiter(concurrency)
        # Which endpoint of each server this loop last probed, to spot new or moved ones.
        self._dispatched: Targets = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Probe until cancelled."""
        send, receive = anyio.create_memory_object_stream[ProbeReport](math.inf)
        async with anyio.create_task_group() as tg, send, receive:
            tg.start_soon(self._apply, receive)
            task_status.started()
            await self._schedule(send)

    async def _schedule(self, send: MemoryObjectSendStream[ProbeReport]) -> None:
        next_round = anyio.current_time()
        seen = self._fleet.targets_changed.revision
        while True:
            timeout = max(0.0, next_round - anyio.current_time())
            seen, _ = await self._fleet.targets_changed.wait_newer(seen, timeout)
            targets = self._fleet.targets()
            if anyio.current_time() >= next_round:
                next_round = anyio.current_time() + self._interval
                batch = targets
                self._dispatched = dict(targets)
            else:
                batch = {n: e for n, e in targets.items() if self._dispatched.get(n) != e}
                self._dispatched = {n: e for n, e in self._dispatched.items() if n in targets}
                self._dispatched.update(batch)
            if batch:
                await self._probe_all(batch, send)

    async def _probe_all(self, batch: Targets, send: MemoryObjectSendStream[ProbeReport]) -> None:
        async with anyio.create_task_group() as tg:
            for server, endpoint in batch.items():
                tg.start_soon(self._probe_one, server, endpoint, send)

    async def _probe_one(
        self, server: ServerName, endpoint: str, send: MemoryObjectSendStream[ProbeReport]
    ) -> None:
        async with self._limiter:
            with tracer.start_as_current_span("discovery.lupine.probe") as span:
                span.set_attribute("rgpu.server", server)
                span.set_attribute("rgpu.endpoint", endpoint)
                outcome = await self._prober.probe(endpoint)
                span.set_attribute("rgpu.probe.result", outcome.result)
        self._instruments.probed(outcome)
        if outcome.result in _NOTEWORTHY:
            logger.debug(
                "probe of %s: %s (%s)",
                endpoint,
                outcome.result,
                outcome.detail,
                extra={"node": server},
            )
        send.send_nowait(ProbeReport(server=server, endpoint=endpoint, outcome=outcome))

    async def _apply(self, receive: MemoryObjectReceiveStream[ProbeReport]) -> None:
        async for report in receive:
            batch = [report]
            while True:
                try:
                    batch.append(receive.receive_nowait())
                except anyio.WouldBlock:
                    break
            self._fleet.apply_probes(batch)
