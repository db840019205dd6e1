"""The composition root of the metrics service.

``create_app`` wires the two followers (discovery's fleet, the allocator's claims), the board
they feed and the routes that render it, inside the shared service edge from
``rgpu_runtime``. The lifespan owns both HTTP clients and every background task; ``/readyz``
turns ready once both sources have answered at least once, and stays ready when one goes
away later, because the last snapshot is still worth exporting (its age says how old it is).

Every replica is scraped, so each card series would reach Prometheus once per replica, and a
HAMi dashboard that sums ``hami_remote_gpu_*`` would count each card that many times. So the
replicas elect one of them through the ``rgpu-metrics-leader`` Lease: the holder serves the
card families, the others only their own self-metrics (process, source health, ``rgpu_leader``)
— they still follow both sources, so a successor exports at once. A follower stays ready: it
is healthy, and its self-metrics are worth scraping. Outside a cluster and without
``RGPU_KUBE_URL`` (a bare process beside discovery and the allocator) there is nobody to
elect with, and the process exports the cards itself.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TypedDict

import anyio
import httpx
from anyio.abc import TaskGroup, TaskStatus
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from rgpu_runtime.feeds import FollowPolicy, FollowStatus
from rgpu_runtime.kube import kube_client
from rgpu_runtime.peers import http_client
from rgpu_runtime.replicas import Election, ElectionTiming
from rgpu_runtime.serving import Readiness, create_service_app, run_service
from rgpu_runtime.settings import Settings

from .board import Board
from .clients import POLICY, follow_claims, follow_fleet
from .instruments import SourceCollector, register_process
from .routes import ROUTES, Deps
from .usage import Usage, UsageCollector

__all__ = ["State", "create_app", "main"]

logger = logging.getLogger(__name__)

SERVICE = "metrics"
LEADER_LEASE = "rgpu-metrics-leader"
"""The Lease whose holder exports the card families (in the system namespace)."""
LEADER_TIMING = ElectionTiming(lease_seconds=10, renew_deadline_seconds=7, retry_seconds=2)
"""A killed exporter's successor serves the cards within 10 s, below Prometheus' usual 15 s
scrape interval, so a failover costs at most one scrape of card series."""


class State(TypedDict):
    """What the lifespan yields; handlers read it through ``routes.deps``."""

    deps: Deps


def create_app(
    settings: Settings,
    *,
    discovery_transport: httpx.AsyncBaseTransport | None = None,
    allocator_transport: httpx.AsyncBaseTransport | None = None,
    registry: CollectorRegistry | None = None,
    policy: FollowPolicy | None = None,
    election: ElectionTiming | None = None,
) -> Starlette:
    """Build the metrics service; transports replace the network to the peers and
    ``election`` the leader lease's timing in tests."""
    registry = CollectorRegistry() if registry is None else registry
    policy = POLICY if policy is None else policy
    readiness = Readiness()
    usage = Usage()
    board = Board(on_claims=usage.claims_changed)
    register_process(registry)
    timeout = policy.wait_seconds + policy.margin_seconds

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        async with (
            http_client(
                base_url=settings.peers.discovery_url,
                timeout=timeout,
                transport=discovery_transport,
            ) as discovery,
            http_client(
                base_url=settings.peers.allocator_url,
                timeout=timeout,
                transport=allocator_transport,
            ) as allocator,
            AsyncExitStack() as stack,
            anyio.create_task_group() as tg,
        ):
            exports_cards = await _elect(settings, stack, tg, registry, election, readiness)
            usage.count_while(exports_cards)
            fleet = follow_fleet(discovery, board, policy)
            claims = follow_claims(allocator, board, policy)
            statuses = (fleet.status, claims.status)
            collector = SourceCollector(board, statuses)
            counter = UsageCollector(usage)
            registry.register(collector)
            registry.register(counter)
            try:
                # Started means "answered once"; the exporter must serve (not ready) before.
                tg.start_soon(fleet.run)
                tg.start_soon(claims.run)
                await tg.start(_ready_once_answered, readiness, statuses)
                yield {"deps": Deps(board=board, registry=registry, exports_cards=exports_cards)}
            finally:
                registry.unregister(collector)
                registry.unregister(counter)
                tg.cancel_scope.cancel()

    app = create_service_app(
        service=SERVICE, routes=[], lifespan=lifespan, readiness=readiness, registry=registry
    )
    # The shared edge serves /metrics from the registry alone, formatting every sample on
    # every scrape; ours joins the board's pre-rendered card families, so it must match first.
    app.router.routes[:0] = ROUTES
    return app


async def _elect(
    settings: Settings,
    stack: AsyncExitStack,
    tg: TaskGroup,
    registry: CollectorRegistry,
    timing: ElectionTiming | None,
    readiness: Readiness,
) -> Callable[[], bool]:
    """Join the election in a cluster (or pointed at an apiserver by ``RGPU_KUBE_URL``);
    returns "do I export the cards"."""
    kube_settings = settings.kube
    if kube_settings.url is None and not kube_settings.service_host:
        logger.warning("no apiserver to elect an exporter with: this process exports every card")
        return lambda: True
    kube = await stack.enter_async_context(kube_client(settings))
    leader = Election(
        kube,
        name=LEADER_LEASE,
        namespace=settings.scheduling.namespace,
        timing=LEADER_TIMING if timing is None else timing,
        registry=registry,
        readiness=readiness,
    )
    await tg.start(leader.run)
    return lambda: leader.is_leader


async def _ready_once_answered(
    readiness: Readiness,
    statuses: Sequence[FollowStatus],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started()
    for status in statuses:
        readiness.set_not_ready(f"waiting for the first answer from {status.name}")
        await status.answered.wait()
    readiness.set_ready()


def main() -> None:
    """Run the metrics service (``python -m rgpu_metrics``) until SIGTERM."""
    raise SystemExit(run_service(SERVICE, create_app, settings=Settings))
