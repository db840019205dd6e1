"""Running the simulated apiserver on loopback inside the caller's event loop.

Tests, the demo and benchmarks all need a real HTTP endpoint that any Kubernetes client can
talk to, started and stopped with the code that uses it. `run_apiserver` serves with uvicorn
(httptools) from a task group it owns and returns only once the socket is listening; leaving
the context cuts open watches and stops the server.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import anyio
import uvicorn
from starlette.types import ASGIApp

from rgpu_kubesim.apiserver.admission import Admission, AdmissionPolicies
from rgpu_kubesim.apiserver.auth import (
    Aggregator,
    Authenticator,
    Authorizer,
    NamespaceGrants,
    UserGrant,
    seed,
)
from rgpu_kubesim.apiserver.endpoints._app import create_app
from rgpu_kubesim.apiserver.endpoints._coalescing import CoalescingHttpToolsProtocol
from rgpu_kubesim.apiserver.endpoints._deps import Deps
from rgpu_kubesim.apiserver.endpoints._faults import Faults
from rgpu_kubesim.apiserver.endpoints._metering import RequestMeter
from rgpu_kubesim.apiserver.kinds import namespaces as _namespaces
from rgpu_kubesim.apiserver.storage import Storage, Store
from rgpu_kubesim.machinery import Refusals
from rgpu_runtime.serving import EmbeddedServer

_STARTUP_SECONDS = 10.0
_SHUTDOWN_GRACE_SECONDS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiOptions:
    """Settings of one simulated apiserver."""

    seed: int = 0
    """Seeds fault draws, generated names and uids, so a run can be replayed."""
    watch_window: int = 10_000
    """Changes retained per resource for watch resumption; older versions get 410 Expired."""
    bookmark_interval_seconds: float = 1.0
    """How often an idle watch that allows bookmarks receives one (kube: about a minute)."""
    service_address_map: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``"<ns>/<svc>:<port>"`` -> ``"127.0.0.1:<port>"`` for webhooks referenced by Service.

    The certificate is verified against ``<svc>.<ns>.svc`` as kube-apiserver does, so the
    webhook's serving certificate must carry that DNS name.
    """
    default_user: str = "kubernetes-admin"
    """Who a request that names no one is: a member of ``system:masters`` (cluster admin, as
    ``kubectl proxy`` acts); the ``X-Sim-User`` request header names someone else."""
    user_agents: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """User-Agent prefix -> username, for clients that cannot send ``X-Sim-User`` (the
    services' kubernetes_asyncio clients announce ``rgpu-<service>``), standing in for the
    service-account tokens kube-apiserver would authenticate."""
    watch_buffer: int = 1_000
    """Events a watcher may have pending before it is cut as too slow."""
    clock: Callable[[], float] = time.time
    """Wall clock in epoch seconds; tokens are issued and expire by it (a seam for tests)."""
    user_grant: UserGrant | None = field(default_factory=UserGrant)
    """The ClusterRole every user named by ``X-Sim-User`` gets in each namespace but kube's
    own (``edit``); None: users get only what RBAC objects written later grant them."""
    namespace_finalize_seconds: float = 0.2
    """How long a deleted namespace stays Terminating before the namespace controller removes
    it (kube's takes a few seconds); new content in it is refused meanwhile."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimApiServer:
    """A running simulated apiserver."""

    url: str
    """Base URL, e.g. ``http://127.0.0.1:40123``."""
    store: Store
    """In-process object access (no admission, no faults)."""
    faults: Faults
    """Fault injection, also reachable as ``/_sim/faults``."""
    meter: RequestMeter
    """Requests and response bytes so far, by client, verb and resource."""
    refusals: Refusals
    """Requests refused as Forbidden (by RBAC or an admission policy), newest kept."""


class _EmbeddedServer(EmbeddedServer):
    """An embedded uvicorn that also reports when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = anyio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.ready.set()


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening, non-blocking TCP socket (port 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when the
    # listening socket says TCP, and without it every response waits out a delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.setblocking(False)
    return sock


def socket_url(sock: socket.socket, scheme: str = "http") -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


@contextlib.asynccontextmanager
async def serving(app: ASGIApp, sock: socket.socket, **config: Any) -> AsyncIterator[None]:
    """Serve ``app`` on ``sock`` with uvicorn (httptools, each answer one write) until the
    block exits.

    ``config`` passes extra uvicorn.Config settings (TLS files, for instance). On exit the
    server stops accepting, finishes in-flight responses for up to two seconds, and the socket
    is closed.
    """
    settings: dict[str, Any] = {
        "http": CoalescingHttpToolsProtocol,
        "ws": "none",
        "lifespan": "off",
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": _SHUTDOWN_GRACE_SECONDS,
    }
    server = _EmbeddedServer(uvicorn.Config(app, **(settings | config)))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(_STARTUP_SECONDS):
                await server.ready.wait()
            if not server.started:
                raise OSError(f"the server on {socket_url(sock)} did not start listening")
            try:
                yield
            finally:
                server.request_stop()
    finally:
        sock.close()


def _authorizer(storage: Storage, options: ApiOptions, refusals: Refusals) -> Authorizer:
    """RBAC with kube's bootstrap policy (aggregated as it is written) and the users' grant."""
    authorizer = Authorizer(
        storage,
        default_user=options.default_user,
        user_agents=options.user_agents,
        refusals=refusals,
    )
    Aggregator(storage)
    seed(storage)
    if options.user_grant is not None:
        NamespaceGrants(storage, options.user_grant)
    return authorizer


@contextlib.asynccontextmanager
async def run_apiserver(
    *, host: str = "127.0.0.1", port: int = 0, options: ApiOptions | None = None
) -> AsyncIterator[SimApiServer]:
    """Serve a fresh simulated cluster on ``host:port`` (0 = ephemeral) until the block exits."""
    options = options or ApiOptions()
    storage = Storage(
        seed=options.seed, watch_window=options.watch_window, watch_capacity=options.watch_buffer
    )
    faults = Faults(storage, seed=options.seed)
    admission = Admission(storage, service_address_map=options.service_address_map)
    meter = RequestMeter()
    refusals = Refusals()
    deps = Deps(
        storage=storage,
        faults=faults,
        admission=admission,
        default_user=options.default_user,
        user_agents=options.user_agents,
        bookmark_interval=options.bookmark_interval_seconds,
        clock=options.clock,
        authn=Authenticator(storage, clock=options.clock),
        authorizer=_authorizer(storage, options, refusals),
        policies=AdmissionPolicies(storage, refusals),
        meter=meter,
    )
    sock = listening_socket(host, port)
    try:
        async with serving(create_app(deps), sock), anyio.create_task_group() as tg:
            await tg.start(_namespaces.run_controller, storage, options.namespace_finalize_seconds)
            try:
                yield SimApiServer(
                    url=socket_url(sock),
                    store=Store(storage),
                    faults=faults,
                    meter=meter,
                    refusals=refusals,
                )
            finally:
                tg.cancel_scope.cancel()
                # Open watches would otherwise hold the graceful shutdown until they time out.
                storage.hub.cut_all()
    finally:
        with anyio.CancelScope(shield=True):
            await admission.aclose()
