"""Four services need the same edge, built the same way.

``create_service_app`` wraps a service's routes and lifespan in a Starlette app that also
serves ``/healthz`` (the process answers), ``/readyz`` (its background tasks have started),
``/metrics`` (its own ``CollectorRegistry``, with OpenMetrics negotiation from
prometheus_client; the listeners count their connections there too), times every request per
route template, limits request bodies while they stream (``BodyLimitMiddleware``), and maps
errors to ``ErrorBody`` JSON with handlers registered once.

The typed-state pattern services copy::

    class State(TypedDict):
        deps: Deps                      # a frozen dataclass of clients and stores

    def deps(request: Request) -> Deps:
        return state_value(request, "deps", Deps)

    def create_app(settings: Settings, *, registry: CollectorRegistry | None = None) -> Starlette:
        readiness = Readiness()

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[State]:
            async with http_client(...) as peers, anyio.create_task_group() as tg:
                await tg.start(watch_things, ...)      # returns once task_status.started()
                readiness.set_ready()
                yield {"deps": Deps(peers=peers, ...)}
                tg.cancel_scope.cancel()

        return create_service_app(service="allocator", routes=ROUTES, lifespan=lifespan,
                                  readiness=readiness, registry=registry)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rgpu_contracts import ContractError
from rgpu_runtime.errors import RgpuError
from rgpu_runtime.settings import DEFAULT_MAX_BODY_BYTES
from rgpu_runtime.telemetry import LatencyMiddleware, latency_histogram

from ._bodylimit import BodyLimitMiddleware
from ._edge import (
    json_response,
    on_contract_error,
    on_http_exception,
    on_internal_error,
    on_rgpu_error,
)
from ._limits import LISTENER_METRICS_STATE, ListenerMetrics
from ._readiness import Readiness

__all__ = ["ServiceLifespan", "create_service_app"]

ServiceLifespan = Callable[[Starlette], AbstractAsyncContextManager[Mapping[str, Any]]]
"""A service's lifespan: opens clients, starts background tasks, yields its state mapping."""


def create_service_app(
    *,
    service: str,
    routes: Sequence[BaseRoute],
    lifespan: ServiceLifespan | None = None,
    readiness: Readiness | None = None,
    registry: CollectorRegistry | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Starlette:
    """Build the Starlette app for ``service`` around its ``routes`` and ``lifespan``.

    With ``readiness`` given, the lifespan flips it (``/readyz`` stays 503 until then);
    without, the app becomes ready as soon as the lifespan has yielded. ``registry``
    defaults to a fresh ``CollectorRegistry``; pass the one the service's own metrics use.
    """
    registry = CollectorRegistry() if registry is None else registry
    auto_ready = readiness is None
    readiness = Readiness() if readiness is None else readiness
    return Starlette(
        routes=[*_health_routes(readiness, registry), *routes],
        middleware=[
            Middleware(LatencyMiddleware, histogram=latency_histogram(registry), service=service),
            Middleware(BodyLimitMiddleware, max_bytes=max_body_bytes),
        ],
        exception_handlers={
            RgpuError: on_rgpu_error,
            ContractError: on_contract_error,
            HTTPException: on_http_exception,
            Exception: on_internal_error,
        },
        lifespan=_tracking(lifespan, readiness, ListenerMetrics(registry), auto_ready=auto_ready),
    )


def _tracking(
    lifespan: ServiceLifespan | None,
    readiness: Readiness,
    listeners: ListenerMetrics,
    *,
    auto_ready: bool,
) -> ServiceLifespan:
    @asynccontextmanager
    async def run(app: Starlette) -> AsyncIterator[Mapping[str, Any]]:
        async with _stateless() if lifespan is None else lifespan(app) as state:
            if auto_ready:
                readiness.set_ready()
            # The server counts its listeners' connections on this app's registry.
            yield {**state, LISTENER_METRICS_STATE: listeners}
        readiness.set_not_ready("stopped")

    return run


@asynccontextmanager
async def _stateless() -> AsyncIterator[Mapping[str, Any]]:
    yield {}


def _health_routes(readiness: Readiness, registry: CollectorRegistry) -> list[BaseRoute]:
    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if readiness.ready:
            return json_response({"ready": True})
        return json_response({"ready": False, "reason": readiness.reason}, 503)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", _AsgiEndpoint(make_asgi_app(registry)), methods=["GET"]),
    ]


class _AsgiEndpoint:
    """Hands a plain ASGI callable to ``Route`` (which would wrap a bare function as a handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
