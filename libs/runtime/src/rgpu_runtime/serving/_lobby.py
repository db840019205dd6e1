"""A connection is admitted or refused when it is accepted, before TLS or HTTP cost anything.

uvicorn hands each accepted connection straight to TLS and HTTP and keeps it as long as the
client likes: ten thousand connections that drip their request line a byte at a time were all
kept, and a TLS listener spends a handshake on each before the HTTP layer sees it. Here each
listening socket is served by an accept loop (``Doorway``) that counts a new connection
against the listener's cap and its client address's cap (``ListenerLimits``) while it is still
a bare socket; beyond either it is closed at once and counted. An admitted connection gets a
``Seat`` whose deadline runs from accept until its request head is complete (the TLS handshake
is bounded by the same time), and only then meets TLS and the HTTP protocol, through
``loop.connect_accepted_socket`` (which asyncio and uvloop both implement alike; upgrading a
live transport with ``start_tls`` loses the ClientHello on uvloop, which starts reading right
after ``connection_made`` whatever the protocol asked).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

from rgpu_runtime.settings import ListenerLimits

from ._limits import ListenerMetrics

__all__ = ["Doorway", "HttpSide", "Lobby", "Seat"]

logger = logging.getLogger(__name__)

TLS_SHUTDOWN_SECONDS = 2.0
"""How long a closing TLS connection waits for the peer's close_notify (asyncio's default is
30 s): the connection holds its place in the counts until then, and a peer that never answers
the close must not hold it for long."""

_REFUSED = b"too many connections: this listener or your address is at its limit"
_REFUSED_PLAIN = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_REFUSED), _REFUSED)
)


class HttpSide(Protocol):
    """What a seat needs of the HTTP protocol it hands the connection to."""

    def head_expired(self) -> bool:
        """The deadline passed: True if a head was still arriving (408 sent, closing)."""
        ...


class Seat:
    """One admitted connection: its client's place in the counts, and its head deadline."""

    __slots__ = ("_deadline", "_lobby", "_refused", "_released", "client", "http")

    def __init__(self, lobby: Lobby, client: str) -> None:
        self._lobby = lobby
        self.client = client
        self.http: HttpSide | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False
        self._released = False

    def arm(self) -> None:
        """Start the head deadline unless it runs already."""
        if self._deadline is None and not self._released:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(self._lobby.limits.header_seconds, self._expire)

    def disarm(self) -> None:
        """The head is complete: the deadline no longer applies."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def refuse(self, reason: str) -> None:
        """Count this connection's refusal, once, whatever else reports it."""
        if not self._refused:
            self._refused = True
            self._lobby.count_refusal(reason)

    def release(self) -> None:
        """The connection is gone: free its place (idempotent)."""
        if not self._released:
            self._released = True
            self.disarm()
            self._lobby.leave(self)

    def _expire(self) -> None:
        # Before the HTTP side exists the TLS handshake is running; its own timeout (the same
        # length, started at the same moment) ends it.
        self._deadline = None
        if self.http is not None and self.http.head_expired():
            self.refuse("header_timeout")


class Lobby:
    """One listener's admission: its caps, its counts, its connections being opened."""

    def __init__(
        self,
        *,
        name: str,
        limits: ListenerLimits,
        ssl_context: ssl.SSLContext | None,
        http: Callable[[Seat], asyncio.Protocol],
    ) -> None:
        self.name = name
        self.limits = limits
        self.ssl = ssl_context
        self.metrics: ListenerMetrics | None = None
        """Set by the server once the app's lifespan has yielded its registry's metrics."""
        self._http = http
        self._open = 0
        self._per_client: Counter[str] = Counter()
        self._opening: set[asyncio.Task[None]] = set()
        self._doorways: list[Doorway] = []

    @property
    def open(self) -> int:
        """Connections admitted and not yet closed."""
        return self._open

    def clients(self) -> dict[str, int]:
        """Open connections by client address."""
        return dict(self._per_client)

    def listen(self, sock: socket.socket) -> Doorway:
        """Start accepting on ``sock``; the result closes like an asyncio ``Server``."""
        sock.setblocking(False)
        doorway = Doorway(self, sock)
        self._doorways.append(doorway)
        return doorway

    async def stop(self) -> None:
        """Stop accepting and cut connections still in their TLS handshake."""
        for doorway in self._doorways:
            doorway.close()
        for doorway in self._doorways:
            await doorway.wait_closed()
        for task in list(self._opening):
            task.cancel()
        if self._opening:
            await asyncio.wait(list(self._opening))

    def admit(self, client: str) -> Seat | None:
        """A seat for a connection from ``client``, or None (counted) when a cap is reached."""
        if self._open >= self.limits.max_connections:
            self.count_refusal("listener_connections")
            return None
        if self._per_client[client] >= self.limits.max_client_connections:
            self.count_refusal("client_connections")
            return None
        self._open += 1
        self._per_client[client] += 1
        self._gauge(1)
        return Seat(self, client)

    def leave(self, seat: Seat) -> None:
        self._open -= 1
        self._per_client[seat.client] -= 1
        if self._per_client[seat.client] <= 0:
            del self._per_client[seat.client]
        self._gauge(-1)

    def count_refusal(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(self.name, reason).inc()

    def welcome(self, conn: socket.socket, client: str) -> None:
        """Admit ``conn`` or close it; an admitted one is opened in the background."""
        seat = self.admit(client)
        if seat is None:
            _refuse(conn, plain=self.ssl is None)
            return
        seat.arm()
        task = asyncio.get_running_loop().create_task(self._open_connection(conn, seat))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    async def _open_connection(self, conn: socket.socket, seat: Seat) -> None:
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if self.ssl is not None:
            tls = {
                "ssl": self.ssl,
                "ssl_handshake_timeout": self.limits.header_seconds,
                "ssl_shutdown_timeout": TLS_SHUTDOWN_SECONDS,
            }
        try:
            await loop.connect_accepted_socket(lambda: self._seated(seat), conn, **tls)
        except (TimeoutError, OSError) as exc:
            # ssl.SSLError and ConnectionError are OSErrors; the loop closed the transport.
            logger.debug("%s: connection from %s not opened: %r", self.name, seat.client, exc)
            seat.refuse("tls_handshake" if self.ssl is not None else "header_timeout")
            seat.release()
            conn.close()
        except asyncio.CancelledError:
            seat.release()
            conn.close()
            raise

    def _seated(self, seat: Seat) -> asyncio.Protocol:
        protocol = self._http(seat)
        seat.http = protocol  # type: ignore[assignment]
        return protocol

    def _gauge(self, change: int) -> None:
        if self.metrics is not None:
            self.metrics.connections.labels(self.name).inc(change)


class Doorway:
    """One listening socket's accept loop, closed and awaited like an asyncio ``Server``."""

    def __init__(self, lobby: Lobby, sock: socket.socket) -> None:
        self._lobby = lobby
        self._sock = sock
        self._task = asyncio.get_running_loop().create_task(self._accept())

    def close(self) -> None:
        self._task.cancel()

    async def wait_closed(self) -> None:
        await asyncio.wait([self._task])

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(self._sock)
            except OSError as exc:
                # Out of file descriptors, say: the backlog keeps the rest until we recover.
                logger.warning("%s: accept failed (%s); retrying", self._lobby.name, exc)
                await asyncio.sleep(0.1)
                continue
            self._lobby.welcome(conn, _client(address))


def _client(address: object) -> str:
    if isinstance(address, tuple) and address:
        return str(address[0])
    return "unknown"


def _refuse(conn: socket.socket, *, plain: bool) -> None:
    # A plain listener can say why in HTTP; a TLS one would need a handshake first, which is
    # exactly the work a refused connection must not get.
    if plain:
        with suppress(OSError):
            conn.send(_REFUSED_PLAIN)
    conn.close()
