"""The composition root: the lifespan opens the clients (apiserver, discovery), has
``assembly`` build the parts and start every background task in one task group, and turns
``/readyz`` ready once all of them have started (for the watches: once their first list is
in).

Decisions are active-active on every replica. The work a replica does on its own initiative —
admitting gated pods, reconciling, sweeping, repairing and nudging, all apiserver writes —
runs only on the replica holding the ``rgpu-allocator-leader`` Lease, so those writes do not
grow with the replica count; a follower is just as ready (it decides as well as the leader).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from rgpu_runtime.kube import kube_client
from rgpu_runtime.peers import DISCOVERY_AUDIENCE, bearer_auth, caller_auth, http_client
from rgpu_runtime.replicas import ElectionTiming
from rgpu_runtime.serving import Readiness, create_service_app

from .assembly import assemble
from .memory import Memory
from .parts import Clients, deps, start
from .routes import ROUTES, State
from .settings import AllocatorSettings

__all__ = ["LEADER_LEASE", "LEADER_TIMING", "create_app"]

DISCOVERY_TIMEOUT = 5.0
"""Seconds for an ordinary discovery call; long-polls add their hold time on top."""
LEADER_LEASE = "rgpu-allocator-leader"
"""The Lease whose holder does the background work (in the system namespace, unlabelled, so
the claim reflector never lists it)."""
LEADER_TIMING = ElectionTiming(lease_seconds=4, renew_deadline_seconds=3, retry_seconds=1)
"""Shorter than client-go's 15 s lease: while no replica leads nobody admits or nudges, so a
killed leader's successor should take over within seconds (one renewal a second in all)."""


def create_app(
    settings: AllocatorSettings,
    *,
    discovery_transport: httpx.AsyncBaseTransport | None = None,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
    election: ElectionTiming | None = None,
) -> Starlette:
    """Build the allocator app; ``discovery_transport`` replaces the network, ``clock``
    the wall clock claims are stamped and judged with, and ``election`` the leader lease's
    timing (tests)."""
    memory = Memory.create(settings, CollectorRegistry() if registry is None else registry)
    readiness = Readiness()
    leader = (LEADER_LEASE, LEADER_TIMING if election is None else election)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        async with _clients(settings, discovery_transport) as clients:
            parts = assemble(
                settings, memory, clients, clock=clock, leader=leader, readiness=readiness
            )
            async with anyio.create_task_group() as tg:
                await start(tg, parts, clients)
                readiness.set_ready()
                auth = caller_auth(settings, clients.kube, routes=("allocation",))
                yield {"deps": deps(parts), "caller_auth": auth}
                tg.cancel_scope.cancel()

    return create_service_app(
        service="allocator",
        routes=ROUTES,
        lifespan=lifespan,
        readiness=readiness,
        registry=memory.registry,
        max_body_bytes=settings.http.max_body_bytes,
    )


@asynccontextmanager
async def _clients(
    settings: AllocatorSettings, transport: httpx.AsyncBaseTransport | None
) -> AsyncIterator[Clients]:
    """The apiserver client, and two discovery clients: long-polls, and probes."""
    url = settings.peers.discovery_url
    async with (
        kube_client(settings) as kube,
        http_client(base_url=url, timeout=DISCOVERY_TIMEOUT, transport=transport) as http,
        http_client(base_url=url, timeout=DISCOVERY_TIMEOUT, transport=transport) as probe_http,
    ):
        # Discovery's probe answers only confirmed callers, so probes carry this service's
        # token; the fleet and topology long-polls are open reads and never wait for one.
        token = bearer_auth(settings, kube, audience=DISCOVERY_AUDIENCE)
        if token is not None:
            probe_http.auth = token
        yield Clients(kube=kube, http=http, probe_http=probe_http)
