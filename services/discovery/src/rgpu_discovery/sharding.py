"""Discovery replicas divide the servers among themselves so each server is probed once per
interval, not once per replica: membership Leases tell who is alive, a consistent-hash ring
over the live members tells who owns which server (``rgpu_runtime.replicas.Membership``).

When the ring changes — a replica joins, leaves (its Lease deleted) or dies (its Lease not
renewed for the membership lease time) — the probe loop is woken at once, and a server this
replica newly owns is probed right away rather than at its next round. So no server goes
unprobed for longer than one probe interval plus the time it takes to notice a death; a
join or a clean leave costs at most one extra probe of each server that moved.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts.ids import ServerName
from rgpu_runtime.replicas import Membership
from rgpu_runtime.serving import Readiness

from .fleet import FleetState
from .instruments import Instruments

__all__ = ["GROUP", "NOT_JOINED", "Shard"]

logger = logging.getLogger(__name__)

GROUP = "discovery"
"""The membership group, part of each replica's Lease name (``discovery-member-<pod>``)."""

NOT_JOINED = (
    "not probing: cannot write this replica's membership Lease (its log says why; the system "
    "namespace must exist and discovery's Role must allow leases)"
)


class Shard:
    """This replica's share of the servers."""

    def __init__(
        self,
        *,
        membership: Membership,
        fleet: FleetState,
        instruments: Instruments,
        readiness: Readiness,
        patience: float,
    ) -> None:
        self._membership = membership
        self._fleet = fleet
        self._readiness = readiness
        self._patience = patience
        self.settled = anyio.Event()
        """Set once this replica's membership is written and the others' are listed."""
        instruments.members.set_function(lambda: len(membership.ring.value.members))
        instruments.owned.set_function(lambda: sum(map(self.owns, fleet.targets())))

    def owns(self, server: ServerName) -> bool:
        """Whether this replica probes ``server`` now."""
        return self._membership.owns(server)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the membership and wake the prober on every ring change, until cancelled.

        Started at once: until the membership is up this replica owns every server (the
        probe loop waits for ``settled`` before its first round, so a replica joining does not
        probe everything once).
        """
        task_status.started()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._unready_until_settled)
            await tg.start(self._membership.run)
            self.settled.set()
            self._fleet.targets_changed.publish(self._fleet.targets_changed.value + 1)
            seen = self._membership.ring.revision
            while True:
                revision, ring = await self._membership.ring.wait_newer(seen, 3600.0)
                if revision != seen:
                    seen = revision
                    logger.info("probing shared by %d replicas", len(ring.members))
                    self._fleet.targets_changed.publish(self._fleet.targets_changed.value + 1)

    async def _unready_until_settled(self) -> None:
        """A replica that cannot join probes nothing; say so on ``/readyz`` rather than
        serve a fleet nobody refreshes, once joining took longer than ``patience``."""
        with anyio.move_on_after(self._patience):
            await self.settled.wait()
        if self.settled.is_set():
            return
        self._readiness.set_not_ready(NOT_JOINED)
        await self.settled.wait()
        if self._readiness.reason == NOT_JOINED:
            self._readiness.set_ready()
