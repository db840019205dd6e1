"""Services are served the same way, fast, and stop gracefully.

Each listener is a uvicorn ``Server`` with httptools (docs/design.md §9: the fast combination with
uvloop, which ``run_service`` selects). Sockets are bound here, before uvicorn starts, so a
bad address fails with a clear ``SettingsError`` and port 0 works (tests learn the real
port from ``running``). The app's lifespan runs once for all listeners (``_lifespan``).
SIGTERM or SIGINT stops accepting, cuts long-polls at once, lets other requests in flight
finish for up to ``DRAIN_SECONDS`` (``_draining``), then runs the app's shutdown (bounded by
``_lifespan.SHUTDOWN_SECONDS``): a service is gone within about 5 s of SIGTERM.

Every listener applies its ``ListenerLimits`` (connection caps, bounded request heads, idle
timeout; see ``_lobby``), counted on the app's registry when the app was built by
``create_service_app`` (its lifespan hands the server its ``ListenerMetrics``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp

from rgpu_runtime.errors import SettingsError
from rgpu_runtime.settings import HostPort, ListenerLimits

from ._draining import Draining
from ._groups import lone_errors
from ._lifespan import app_lifespan, with_state
from ._limits import LISTENER_METRICS_STATE, ListenerMetrics
from ._uvicorn import EmbeddedServer

__all__ = ["Listener", "running", "serve", "serve_listeners"]

logger = logging.getLogger(__name__)

DRAIN_SECONDS = 2.0
"""Seconds ordinary requests in flight get after SIGTERM (ours answer in milliseconds; the
extender's filter budget is 4 s, and a filter cut short is retried by kube-scheduler)."""

GRACE_SECONDS = 3
"""uvicorn's own bound (whole seconds) on its connections once stopping: a backstop just past
``DRAIN_SECONDS``, since the drain has cut every request by then."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Listener:
    """One socket to serve on: an address and, for TLS, a PEM certificate and key.

    ``face`` builds what this socket serves from the process's app (a route allow-list, say),
    so one process can show different surfaces on different sockets with one lifespan, one
    registry and one set of handlers; ``client_ca_file`` makes the TLS handshake verify a
    client certificate signed by that CA: ``required`` refuses a handshake without one,
    ``optional`` lets the face decide per path (the ASGI ``tls`` extension carries the
    verified chain). ``name`` labels the listener's metrics; ``limits`` bound what one
    client can hold on it.
    """

    listen: HostPort | str
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    face: Callable[[ASGIApp], ASGIApp] | None = None
    client_ca_file: str | None = None
    client_cert: Literal["required", "optional"] = "required"
    name: str = "http"
    limits: ListenerLimits = field(default_factory=ListenerLimits)


async def serve(
    app: ASGIApp,
    *,
    listen: HostPort | str,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> None:
    """Serve ``app`` on ``listen`` until SIGTERM or SIGINT."""
    listener = Listener(listen=listen, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)
    await serve_listeners(app, [listener])


async def serve_listeners(
    app: ASGIApp,
    listeners: Sequence[Listener],
    *,
    ready: Callable[[tuple[str, ...]], object] | None = None,
) -> None:
    """Serve ``app`` on every listener, lifespan once, until SIGTERM or SIGINT.

    ``ready`` is called with the listeners' base URLs once they accept connections (useful
    with port 0, e.g. for a demo that starts services and then talks to them).
    """
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with running(app, *listeners) as urls:
            if ready is not None:
                ready(urls)
            async for signum in signals:
                logger.info("received %s; stopping", signal.Signals(signum).name)
                return


@contextlib.asynccontextmanager
async def running(app: ASGIApp, *listeners: Listener) -> AsyncIterator[tuple[str, ...]]:
    """Run ``app`` on ``listeners`` while the block runs; yields their base URLs in order.

    On exit, stops accepting, cuts long-polls, waits up to ``DRAIN_SECONDS`` for other
    requests in flight, then runs the app's shutdown. Raises ``SettingsError`` when an
    address cannot be bound or a certificate cannot be loaded.
    """
    sockets: list[socket.socket] = []
    draining = Draining()
    try:
        for listener in listeners:
            sockets.append(_bind(listener))
        servers = [_server(_face(app, listener), listener) for listener in listeners]
        with lone_errors():
            async with app_lifespan(app) as state, anyio.create_task_group() as tg:
                _count_on(servers, listeners, state)
                for server, sock in zip(servers, sockets, strict=True):
                    stateful = with_state(server.config.loaded_app, state)
                    server.config.loaded_app = draining.wrap(stateful)
                    tg.start_soon(server.serve, [sock])
                urls = tuple(map(_url, sockets, listeners))
                await _started(servers)
                logger.info("serving on %s", ", ".join(urls))
                try:
                    yield urls
                finally:
                    await _stop(servers, draining)
    finally:
        # uvicorn closes the sockets it served; these close the ones it never got to.
        for sock in sockets:
            sock.close()


async def _stop(servers: Sequence[EmbeddedServer], draining: Draining) -> None:
    # Signals are handled once for all listeners by serve_listeners; uvicorn's own handling
    # would stop only the server that installed its handler last, then re-raise the signal.
    for server in servers:
        server.request_stop()
    # Shielded: the block may be exiting because it was cancelled, and the drain is bounded.
    with anyio.CancelScope(shield=True):
        await draining.drain(DRAIN_SECONDS)


def _count_on(
    servers: Sequence[EmbeddedServer], listeners: Sequence[Listener], state: dict[str, Any]
) -> None:
    metrics = state.get(LISTENER_METRICS_STATE)
    if not isinstance(metrics, ListenerMetrics):
        # An app not built by create_service_app: count anyway, on a registry nobody scrapes.
        metrics = ListenerMetrics(CollectorRegistry())
    for server, listener in zip(servers, listeners, strict=True):
        metrics.follow(listener.name)
        if server.lobby is not None:
            server.lobby.metrics = metrics


def _face(app: ASGIApp, listener: Listener) -> ASGIApp:
    return app if listener.face is None else listener.face(app)


def _server(app: ASGIApp, listener: Listener) -> EmbeddedServer:
    config = uvicorn.Config(
        app,
        http="httptools",
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACE_SECONDS,
        ssl_certfile=listener.ssl_certfile,
        ssl_keyfile=listener.ssl_keyfile,
        ssl_ca_certs=listener.client_ca_file,
        ssl_cert_reqs=_cert_reqs(listener),
    )
    # Seconds, not uvicorn's whole ones: the setting accepts fractions (tests use them).
    config.timeout_keep_alive = listener.limits.idle_seconds  # type: ignore[assignment]
    try:
        config.load()
    except (OSError, ssl.SSLError) as exc:
        ca = "" if listener.client_ca_file is None else f", client CA {listener.client_ca_file!r}"
        raise SettingsError(
            f"cannot load TLS certificate {listener.ssl_certfile!r} / key "
            f"{listener.ssl_keyfile!r}{ca} ({exc}); check RGPU_TLS_CERT_FILE and RGPU_TLS_KEY_FILE"
            + ("" if listener.client_ca_file is None else " and RGPU_SCHEDULER_CLIENT_CA_FILE")
        ) from exc
    return EmbeddedServer(config, name=listener.name, limits=listener.limits)


def _cert_reqs(listener: Listener) -> ssl.VerifyMode:
    if listener.client_ca_file is None:
        return ssl.CERT_NONE
    return ssl.CERT_REQUIRED if listener.client_cert == "required" else ssl.CERT_OPTIONAL


def _bind(listener: Listener) -> socket.socket:
    address = _address(listener.listen)
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says TCP; without it each small response waits out a delayed ACK (~40 ms)
    # on the plain asyncio loop.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.host, address.port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise SettingsError(
            f"cannot listen on {address} ({exc}); choose a free local address and port"
        ) from exc
    return sock


def _address(listen: HostPort | str) -> HostPort:
    return listen if isinstance(listen, HostPort) else HostPort.parse(listen, key="listen")


def _url(sock: socket.socket, listener: Listener) -> str:
    host = _address(listener.listen).host
    port = sock.getsockname()[1]
    scheme = "https" if listener.ssl_certfile else "http"
    return f"{scheme}://{HostPort(host=host, port=port)}"


async def _started(servers: Sequence[uvicorn.Server]) -> None:
    # uvicorn sets `started` once its asyncio servers accept; connections made earlier would
    # wait in the listen backlog anyway, but callers may want to log "serving" truthfully.
    while not all(server.started for server in servers):  # noqa: ASYNC110 (uvicorn has no event)
        await anyio.sleep(0.005)
