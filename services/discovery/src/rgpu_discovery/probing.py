"""A server's Node says it exists; only its lupine port says whether it
is alive and which GPUs already have clients. Every listed server is probed once per interval,
concurrently but bounded, and a server that just appeared (or moved) is probed at once rather
than an interval later, so a new server's busy set is known before anyone is placed on it.

The probes themselves go through ``ProbeFlights``, shared with on-demand re-probes: a round
that meets a probe already in flight for a server waits for it rather than probing twice, and
the schedule of rounds never moves because of on-demand probes.
"""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts.ids import ServerName

from .fleetstate import FleetState
from .flights import ProbeFlights

__all__ = ["ProbeLoop"]

Targets = dict[ServerName, str]


class ProbeLoop:
    """Probes the fleet's servers every ``interval`` seconds, at most ``concurrency`` at once."""

    def __init__(
        self,
        *,
        fleet: FleetState,
        flights: ProbeFlights,
        interval: float,
        concurrency: int = 64,
    ) -> None:
        self._fleet = fleet
        self._flights = flights
        self._interval = interval
        self._limiter = anyio.CapacityLimiter(concurrency)
        # Which endpoint of each server this loop last probed, to spot new or moved ones.
        self._dispatched: Targets = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Probe until cancelled (``ProbeFlights.run`` must be running)."""
        task_status.started()
        await self._schedule()

    async def _schedule(self) -> None:
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
                self._flights.retain(targets)
            else:
                batch = {n: e for n, e in targets.items() if self._dispatched.get(n) != e}
                self._dispatched = {n: e for n, e in self._dispatched.items() if n in targets}
                self._dispatched.update(batch)
            if batch:
                await self._probe_all(batch)

    async def _probe_all(self, batch: Targets) -> None:
        async with anyio.create_task_group() as tg:
            for server, endpoint in batch.items():
                tg.start_soon(self._probe_one, server, endpoint)

    async def _probe_one(self, server: ServerName, endpoint: str) -> None:
        async with self._limiter:
            await self._flights.probe(server, endpoint)
