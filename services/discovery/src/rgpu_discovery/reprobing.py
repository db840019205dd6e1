"""Busy sets are learned by probing once per interval (15 s by
default), so when a holder pod finishes and its lupine client disconnects, discovery keeps
reporting its cards busy until the next round, and the allocator would refuse the next pod
for up to an interval. DESIGN §4's "no stale refusals" rule asks for a fresh read before
refusing: the allocator asks discovery to probe that one server now, and this module answers.

An on-demand probe is the periodic probe (same code, same rules, shared through
``ProbeFlights``), so its result moves the fleet's revision exactly as a periodic one would,
and long-poll waiters see it at once. A burst of refusals must not hammer a lupine server:
a server probed less than ``min_interval`` ago is not probed again (the answer is the
current state), and concurrent requests share the probe in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from rgpu_contracts.fleet import Server
from rgpu_contracts.ids import ServerName

from .errors import NoEndpoint, NotListedYet, UnknownServer
from .fleetstate import FleetState
from .flights import ProbeFlights
from .instruments import Instruments, OnDemandOutcome
from .published import Item

__all__ = ["REPROBE_MIN_INTERVAL", "Reprobed", "Reprober"]

REPROBE_MIN_INTERVAL: Final = 0.25
"""Seconds a server's last probe stays fresh enough to answer with. A healthy lupine answers
in about a millisecond, so four probes a second per server is nothing to it, while a burst of
refusals for one server (every pending pod retried at once) still costs one probe."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reprobed:
    """What the fleet says about one server once an on-demand probe request was served."""

    outcome: OnDemandOutcome
    revision: int
    """The fleet's revision right after the probe's result was applied."""
    server: Item[Server]
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
