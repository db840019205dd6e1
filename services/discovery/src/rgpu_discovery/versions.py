"""Which CUDA a lupine server serves changes only when lupine is replaced, and asking costs the
GPU host a process (one more connection), so the question is asked rarely: right after a
server is first probed by this replica, whenever it answers again after being unreachable
(a restart is when an upgrade happens), and otherwise at most once per ``interval`` per server
(an upgrade between two probes is caught within it). A server whose build sends no version is
asked no more often than that either.

The answer rides on the probe's outcome into the server's probe state, so every replica's fleet
shows it, whoever asked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Final

import anyio

from rgpu_contracts.ids import ServerName

from .fleet import FleetState
from .lupine import ProbeOutcome
from .lupine_version import VersionAnswer

__all__ = ["VERSION_INTERVAL", "Ask", "Versions"]

VERSION_INTERVAL: Final = 300.0
"""Seconds between two questions to a server that stays reachable: the probe-state heartbeat's
period, so a fleet at rest costs a GPU host one extra process every five minutes."""

Ask = Callable[[str], Awaitable[VersionAnswer]]
"""Asks the lupine at an endpoint for its CUDA version (``lupine_version.ask_cuda_version``)."""


class Versions:
    """Adds the CUDA version to probe outcomes when it is due (see the module)."""

    def __init__(
        self,
        *,
        fleet: FleetState,
        ask: Ask,
        count: Callable[[str], None] = lambda _: None,
        interval: float = VERSION_INTERVAL,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        self._fleet = fleet
        self._ask = ask
        self._count = count
        self._interval = interval
        self._clock = clock
        self._asked: dict[ServerName, tuple[str, float]] = {}

    def due(self, server: ServerName, endpoint: str) -> bool:
        """Whether ``server`` at ``endpoint`` should be asked after a probe that answered."""
        last = self._asked.get(server)
        if last is None or last[0] != endpoint:
            return True
        state = self._fleet.state(server)
        if state is not None and state.endpoint == endpoint and not state.probe.reachable:
            return True
        return self._clock() - last[1] >= self._interval

    async def after_probe(
        self, server: ServerName, endpoint: str, outcome: ProbeOutcome
    ) -> ProbeOutcome:
        """``outcome`` with the CUDA version when a question was due and answered."""
        if not outcome.answered or not self.due(server, endpoint):
            return outcome
        self._asked[server] = (endpoint, self._clock())
        answer = await self._ask(endpoint)
        self._count("answered" if answer.version is not None else "unanswered")
        connections = outcome.connections + answer.connections
        return replace(outcome, cuda_version=answer.version, connections=connections)

    def retain(self, servers: Iterable[ServerName]) -> None:
        """Forget servers gone from the fleet (one that comes back is asked at once)."""
        keep = set(servers)
        self._asked = {name: asked for name, asked in self._asked.items() if name in keep}
