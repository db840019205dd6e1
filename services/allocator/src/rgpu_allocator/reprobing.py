"""Lupine reports a card busy until discovery's next periodic probe
(15 s by default) after its client left, and a busy card no claim of ours explains (a client
placed outside rgpu, or our pod that went away between probes) would refuse pods all that
time. So before refusing a pod that only busy reports keep from a server, those servers are
probed again through discovery and the pod is decided once more on their fresh states
(DESIGN §4, "no stale refusals"). The fresh states serve this request only: discovery's
long-poll delivers the same change to every replica moments later.

Probes cost discovery and lupine work, so they are bounded three ways: the best-placed few
servers per refusal, a per-replica budget of probes per second, and a short timeout per
call, all made at once so a refusal waits for at most one timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import anyio
from opentelemetry import trace

from rgpu_contracts import Server
from rgpu_placement import FleetView
from rgpu_runtime import TokenBucket

from .discovery_client import DiscoveryClient
from .errors import DiscoveryUnavailable
from .instruments import Instruments

__all__ = ["MAX_SERVERS", "PROBES_PER_SECOND", "PROBE_TIMEOUT", "Reprober"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

MAX_SERVERS = 3
"""Busy servers re-probed per refusal: the best-placed few; a pod needs only one."""
PROBES_PER_SECOND = 20.0
"""Re-probes per second per replica, sustained; refusals beyond that trust the cached fleet
(discovery also serves a server probed less than 0.25 s ago from its last probe)."""
PROBE_TIMEOUT = 0.5
"""Seconds a re-probe may take: well inside the extender's wait for an allocation, and a
lupine slower than that is left to discovery, whose result then reaches us by long-poll."""


class Reprober:
    """Asks discovery to probe busy servers now, within bounds, and returns the fresh view."""

    __slots__ = ("_budget", "_client", "_instruments")

    def __init__(
        self,
        client: DiscoveryClient,
        instruments: Instruments,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._instruments = instruments
        self._budget = TokenBucket(PROBES_PER_SECOND, clock=monotonic)

    async def refresh(self, view: FleetView, servers: Sequence[str]) -> FleetView | None:
        """``view`` with fresh states of up to ``MAX_SERVERS`` of ``servers``, best first;
        ``None`` when no re-probe found any of them changed."""
        fresh: list[Server] = []
        chosen = self._within_budget(servers[:MAX_SERVERS])
        with tracer.start_as_current_span("reprobe", attributes={"servers": len(chosen)}):
            async with anyio.create_task_group() as tg:
                for server in chosen:
                    tg.start_soon(self._probe, server, fresh)
        changed = [s for s in fresh if s.name in view.facts and view.facts[s.name].server != s]
        return view.with_servers(changed) if changed else None

    def _within_budget(self, servers: Sequence[str]) -> list[str]:
        chosen = [s for s in servers if self._budget.take()]
        skipped = len(servers) - len(chosen)
        if skipped:
            self._instruments.reprobes.labels("over_budget").inc(skipped)
        return chosen

    async def _probe(self, server: str, fresh: list[Server]) -> None:
        try:
            found = await self._ask(server)
        except DiscoveryUnavailable as exc:
            logger.debug("re-probe of %s failed, keeping the cached state: %s", server, exc)
            self._count("unavailable")
            return
        if found is None or found.name != server:
            self._count("not_probed")
            return
        fresh.append(found)
        self._count("answered")

    async def _ask(self, server: str) -> Server | None:
        # httpx times each read; this bounds the whole call, however the answer trickles in.
        with anyio.move_on_after(PROBE_TIMEOUT):
            return await self._client.probe(server, PROBE_TIMEOUT)
        raise DiscoveryUnavailable(f"discovery did not re-probe {server} in {PROBE_TIMEOUT} s")

    def _count(self, outcome: str) -> None:
        self._instruments.reprobes.labels(outcome).inc()
