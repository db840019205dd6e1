"""The composition root of the metrics service.

``create_app`` wires the two followers (discovery's fleet, the allocator's claims), the board
they feed and the routes that render it, inside the shared service edge from
``rgpu_runtime``. The lifespan owns both HTTP clients and every background task; ``/readyz``
turns ready once both sources have answered at least once, and stays ready when one goes
away later, because the last snapshot is still worth exporting (its age says how old it is).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TypedDict

import anyio
import httpx
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from rgpu_runtime import (
    FollowPolicy,
    FollowStatus,
    Readiness,
    Settings,
    create_service_app,
    http_client,
    run_service,
)

from .board import Board
from .clients import POLICY, follow_claims, follow_fleet
from .instruments import SourceCollector, register_process
from .routes import ROUTES, Deps

__all__ = ["State", "create_app", "main"]

SERVICE = "metrics"


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
) -> Starlette:
    """Build the metrics service; transports replace the network to the peers in tests."""
    registry = CollectorRegistry() if registry is None else registry
    policy = POLICY if policy is None else policy
    readiness = Readiness()
    board = Board()
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
            anyio.create_task_group() as tg,
        ):
            fleet = follow_fleet(discovery, board, policy)
            claims = follow_claims(allocator, board, policy)
            statuses = (fleet.status, claims.status)
            collector = SourceCollector(board, statuses)
            registry.register(collector)
            try:
                # Started means "answered once"; the exporter must serve (not ready) before.
                tg.start_soon(fleet.run)
                tg.start_soon(claims.run)
                await tg.start(_ready_once_answered, readiness, statuses)
                yield {"deps": Deps(board=board, registry=registry)}
            finally:
                registry.unregister(collector)
                tg.cancel_scope.cancel()

    app = create_service_app(
        service=SERVICE, routes=[], lifespan=lifespan, readiness=readiness, registry=registry
    )
    # The shared edge serves /metrics from the registry alone, formatting every sample on
    # every scrape; ours joins the board's pre-rendered card families, so it must match first.
    app.router.routes[:0] = ROUTES
    return app


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
    raise SystemExit(run_service(SERVICE, create_app))
