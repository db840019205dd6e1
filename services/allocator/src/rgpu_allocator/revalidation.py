"""A refusal must not be stale: before answering "no fit", the allocator takes one fresh look
at what blocked the servers that nearly fit (docs/design.md#no-stale-refusals).

Claims: kube-scheduler retries a refused pod when the holder pod is deleted or finishes —
usually before the allocator's own watch has delivered that change. Refusing then would park
the pod for a whole backoff (or minutes). So the blocking holders are checked against a fresh
read of their pods; a holder that is gone or finished loses its claim on the spot, and the
server is used. Fresh reads cost apiserver calls, so they are bounded three ways: each blocked
Lease is re-read at most once per second (between re-reads the cached copy is used), only the
few best-placed blocked servers are looked at per refusal, and fresh pod reads come from a
per-replica budget. The holder check itself is deliberately not limited per Lease: the retry
that follows a holder's deletion must see the deletion even if that Lease was checked a moment
before.

Busy cards: lupine reports a card busy until discovery's next periodic probe (15 s by default)
after its client left, and a busy card no claim of ours explains (a client placed outside rgpu,
or our pod that went away between probes) would refuse pods all that time. So the servers only
busy reports keep from a pod are probed again through discovery and the pod is decided once
more on their fresh states. The fresh states serve this request only: discovery's long-poll
delivers the same change to every replica moments later. Probes are bounded too: the
best-placed few servers per refusal, a per-replica budget of probes per second, and a short
timeout per call, all made at once so a refusal waits for at most one timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import anyio
from opentelemetry import trace

from rgpu_contracts import Claim, PodUID, Server
from rgpu_placement import FleetView, Validity
from rgpu_runtime.pacing import TokenBucket

from .clients import DiscoveryClient, KubeApi
from .errors import DiscoveryUnavailable
from .instruments import Instruments
from .judging import Judge
from .leases import LeaseWriter
from .pods import PodInfo
from .removal import Remover, read_pod

__all__ = ["MAX_SERVERS", "PROBES_PER_SECOND", "PROBE_TIMEOUT", "Reprober", "Revalidator"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

LEASE_INTERVAL = 1.0
"""Seconds between two fresh reads of the same Lease (docs/design.md#no-stale-refusals)."""
MAX_LEASES = 4
"""Blocked servers checked per refusal: the best-placed few; a pod needs only one."""
POD_READS_PER_SECOND = 50.0
"""Fresh holder reads per second per replica, sustained; refusals beyond that trust the cache.
kube-scheduler attempts each pending pod at most once per backoff (1-10 s), so this covers
hundreds of pending pods."""

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
        with tracer.start_as_current_span("reprobe", attributes={"rgpu.servers": len(chosen)}):
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


class Revalidator:
    """Re-checks the holders of blocked servers with fresh reads, within bounds."""

    __slots__ = ("_api", "_budget", "_judge", "_monotonic", "_remover", "_reread", "_writer")

    def __init__(
        self,
        judge: Judge,
        api: KubeApi,
        writer: LeaseWriter,
        remover: Remover,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._judge = judge
        self._api = api
        self._writer = writer
        self._remover = remover
        self._monotonic = monotonic
        self._reread: dict[str, float] = {}
        self._budget = TokenBucket(POD_READS_PER_SECOND, clock=monotonic)

    async def revalidate(self, servers: Sequence[str]) -> bool:
        """Check up to ``MAX_LEASES`` of ``servers``; returns whether any of them changed."""
        checked = self._chosen(servers)
        changed = False
        with tracer.start_as_current_span("revalidate", attributes={"rgpu.servers": len(checked)}):
            for server in checked:
                changed = await self._check(server) or changed
        return changed

    def _chosen(self, servers: Sequence[str]) -> Sequence[str]:
        """Up to ``MAX_LEASES`` of ``servers`` (best first): those whose holder was asked to stop
        go first. Their holders are the ones likely to have ended unseen, and with a fleet held
        whole the best-placed few would rarely include the server that just freed."""
        judge = self._judge
        leaving = {c.server for uid in judge.pods.deleting() for c in judge.ledger.claims_of(uid)}
        if not leaving:
            return servers[:MAX_LEASES]
        # sorted is stable: within each group the servers keep their best-first order.
        return sorted(servers, key=lambda s: s not in leaving)[:MAX_LEASES]

    def _lease_due(self, server: str) -> bool:
        now = self._monotonic()
        if now - self._reread.get(server, -LEASE_INTERVAL) < LEASE_INTERVAL:
            return False
        self._reread[server] = now
        return True

    async def _check(self, server: str) -> bool:
        before = self._judge.ledger.lease(server)
        record = await self._writer.reread(server) if self._lease_due(server) else before
        if record is None:
            return before is not None
        seen: dict[PodUID, PodInfo | None] = {}
        doomed = [c for c in record.claims if await self._invalid(c, seen)]
        # The removal judges each claim again on the Lease it writes: one committed since
        # this look stays.
        removed = await self._remover.drop_invalid(server, seen) if doomed else 0
        return removed > 0 or record != before

    async def _invalid(self, claim: Claim, seen: dict[PodUID, PodInfo | None]) -> bool:
        """Whether ``claim`` is invalid, on the cache or else on a fresh read of its pod (kept
        in ``seen``) when the budget allows."""
        if self._judge.validity(claim) is Validity.INVALID:
            return True
        if not self._budget.take():
            return False
        seen[claim.pod.uid] = await read_pod(self._api, claim)
        return self._judge.validity(claim, seen) is Validity.INVALID
