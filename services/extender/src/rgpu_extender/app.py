"""The composition root. ``create_app`` wires the verbs to their clients
and background tasks, all owned by one lifespan; ``main`` serves the app on two listeners,
each through its own ``Surface``: the scheduler listener on ``RGPU_LISTEN`` (kube-scheduler's
verbs, health, metrics; TLS with a required client certificate when
``RGPU_SCHEDULER_CLIENT_CA_FILE`` is set) and, when a certificate is configured, the webhook
listener on the TLS ``RGPU_WEBHOOK_LISTEN`` (``/mutate`` and health only, since the
NetworkPolicy must open that port to the whole cluster network).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TypedDict

import anyio
import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from rgpu_placement import FleetView
from rgpu_runtime.feeds import DiscoveryMirror
from rgpu_runtime.kube import EventRecorder, kube_client
from rgpu_runtime.peers import ALLOCATOR_AUDIENCE, bearer_auth, http_client
from rgpu_runtime.serving import Listener, Readiness, create_service_app, run_service
from rgpu_runtime.telemetry import PodCreations

from .admission import AdmissionPolicy
from .binding import Binding
from .clients import AllocatorClient, Apiserver
from .events import event_recorder
from .filtering import Filtering
from .instruments import ExtenderMetrics
from .recent import RecentBookings
from .routes import ROUTES, Deps
from .scoring import Scoring
from .settings import ExtenderSettings
from .surfaces import WEBHOOK_MAX_BODY_BYTES, scheduler_surface, webhook_surface

__all__ = ["State", "create_app", "listeners", "main"]

logger = logging.getLogger(__name__)


class State(TypedDict):
    """What the lifespan yields; handlers read it through ``routes.deps``."""

    deps: Deps


def create_app(
    settings: ExtenderSettings,
    *,
    allocator_transport: httpx.AsyncBaseTransport | None = None,
    discovery_transport: httpx.AsyncBaseTransport | None = None,
    registry: CollectorRegistry | None = None,
) -> Starlette:
    """Build the extender app; transports replace the real network in tests."""
    registry = CollectorRegistry() if registry is None else registry
    metrics = ExtenderMetrics.create(registry)
    readiness = Readiness()
    budget = settings.scheduling.extender_budget_seconds

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        async with AsyncExitStack() as stack:
            allocator_http = await stack.enter_async_context(
                http_client(
                    base_url=settings.peers.allocator_url,
                    timeout=budget,
                    transport=allocator_transport,
                )
            )
            discovery_http = await stack.enter_async_context(
                http_client(
                    base_url=settings.peers.discovery_url,
                    timeout=budget,
                    transport=discovery_transport,
                )
            )
            kube = await stack.enter_async_context(kube_client(settings))
            allocator_http.auth = (
                bearer_auth(settings, kube, audience=ALLOCATOR_AUDIENCE) or httpx.Auth()
            )
            discovery = DiscoveryMirror(
                FleetView.build, topology_keys=settings.scheduling.topology_keys
            )
            metrics.follow_ages(discovery.age)
            events = event_recorder(component=settings.scheduling.scheduler_name, metrics=metrics)
            tg = await stack.enter_async_context(anyio.create_task_group())
            for follower in discovery.followers(discovery_http):
                tg.start_soon(follower.run)
            # Serve from the first request either way: with a fleet when discovery answered,
            # with filter's ``Error`` (kube-scheduler retries) when it did not.
            await discovery.asked_once()
            await tg.start(events.run, kube)
            readiness.set_ready()
            deps = _deps(
                settings,
                allocator=AllocatorClient(allocator_http),
                apiserver=Apiserver(kube),
                discovery=discovery,
                events=events,
                metrics=metrics,
            )
            try:
                yield {"deps": deps}
            finally:
                tg.cancel_scope.cancel()

    # Each listener's Surface enforces its own, smaller limit; this one only has to admit both.
    return create_service_app(
        service="extender",
        routes=ROUTES,
        lifespan=lifespan,
        readiness=readiness,
        registry=registry,
        max_body_bytes=max(settings.edge.scheduler_max_body_bytes, WEBHOOK_MAX_BODY_BYTES),
    )


def _deps(
    settings: ExtenderSettings,
    *,
    allocator: AllocatorClient,
    apiserver: Apiserver,
    discovery: DiscoveryMirror[FleetView],
    events: EventRecorder,
    metrics: ExtenderMetrics,
) -> Deps:
    """Each verb with the clients and stores it decides with."""
    budget = settings.scheduling.extender_budget_seconds
    resources = settings.resources
    recent = RecentBookings()
    return Deps(
        filtering=Filtering(
            allocator=allocator,
            discovery=discovery,
            events=events,
            metrics=metrics,
            resources=resources,
            budget=budget,
            recent=recent,
        ),
        scoring=Scoring(
            allocator=allocator,
            discovery=discovery,
            metrics=metrics,
            topology_keys=settings.scheduling.topology_keys,
            budget=budget,
            recent=recent,
        ),
        binding=Binding(
            allocator=allocator,
            apiserver=apiserver,
            events=events,
            metrics=metrics,
            resources=resources,
            budget=budget,
            keep_refused=settings.admission.mode == "gate",
        ),
        admission=AdmissionPolicy.from_settings(settings),
        metrics=metrics,
        creations=PodCreations(),
    )


def listeners(settings: ExtenderSettings) -> Sequence[Listener]:
    """The scheduler listener, plus the TLS webhook listener when a certificate is set."""
    http, edge = settings.http, settings.edge
    scheduler = _scheduler_listener(settings)
    if edge.tls_cert_file is None or edge.tls_key_file is None:
        logger.warning(
            "RGPU_TLS_CERT_FILE/RGPU_TLS_KEY_FILE unset: no TLS webhook listener, so the "
            "apiserver cannot call /mutate; GPU pods will not be mutated"
        )
        return [scheduler]
    # The apiserver's client certificate is checked per path (health stays open to the
    # kubelet), so the handshake verifies one only when it is offered.
    webhook = Listener(
        listen=edge.webhook_listen,
        ssl_certfile=edge.tls_cert_file,
        ssl_keyfile=edge.tls_key_file,
        client_ca_file=edge.webhook_client_ca_file,
        client_cert="optional",
        face=webhook_surface(require_client_cert=edge.webhook_client_ca_file is not None),
        name="webhook",
        limits=http.limits,
    )
    return [scheduler, webhook]


def _scheduler_listener(settings: ExtenderSettings) -> Listener:
    http, edge = settings.http, settings.edge
    face = scheduler_surface(edge.scheduler_max_body_bytes)
    if edge.scheduler_client_ca_file is None:
        return Listener(listen=http.listen, face=face, name="scheduler", limits=http.limits)
    # kube-scheduler's extender tlsConfig presents its certificate; nobody else gets a reply.
    return Listener(
        listen=http.listen,
        ssl_certfile=edge.tls_cert_file,
        ssl_keyfile=edge.tls_key_file,
        client_ca_file=edge.scheduler_client_ca_file,
        face=face,
        name="scheduler",
        limits=http.limits,
    )


def main() -> None:
    """Run the extender until SIGTERM (``python -m rgpu_extender``)."""
    # httpx logs every request at INFO: one line per filter and bind, which would drown the
    # decisions the extender logs itself.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    raise SystemExit(
        run_service("extender", create_app, settings=ExtenderSettings, listeners=listeners)
    )
