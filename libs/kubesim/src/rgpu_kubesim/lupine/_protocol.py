"""A real lupine RPC port speaks HTTP/1.1 and HTTP/2 prior knowledge
on the same socket (newer builds sniff the client preface; the released build speaks only
HTTP/2), and discovery's probes depend on exactly that behaviour, faults included. This is the
per-connection state machine; it is callback-driven (``asyncio.Protocol``) so a fleet of
hundreds of fake servers costs no tasks, and a fault set by a test takes effect on the very
next byte.

The released HTTP/2-only build greets every connection with its SETTINGS frame, answers any
request (any method, any path) with a 200 whose only header is ``x-lupine-cuda-version`` (the
CUDA version it serves; no ``server`` header), and resets the connection about 0.2 ms later
(``SO_LINGER{1,0}``); a client that is not HTTP/2 gets the SETTINGS frame, then the reset.
Clients that reuse the connection, or acknowledge SETTINGS after the reply, fail exactly as
they do against the real server. ``hangup="close"`` keeps the older, clean behaviour.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from http import HTTPStatus
from typing import Final, Protocol, cast

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import ConnectionTerminated, DataReceived, RequestReceived
from h2.exceptions import ProtocolError

from rgpu_kubesim.lupine._http1 import MalformedRequest, Request, RequestReader, response_head
from rgpu_kubesim.lupine._metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rgpu_kubesim.lupine._metrics import render_metrics
from rgpu_kubesim.lupine._state import LupineState

__all__ = ["PREFACE", "LupineProtocol"]

logger = logging.getLogger(__name__)

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
VERSION_HEADER: Final = "x-lupine-cuda-version"
RESET_DELAY: Final = 0.0002
"""Seconds between the released build's reply and its reset, as measured on loopback."""
_LINGER_RESET: Final = struct.pack("ii", 1, 0)
_TEXT: Final = "text/plain; charset=utf-8"


class _Side(Protocol):
    def feed(self, data: bytes) -> None: ...


class LupineProtocol(asyncio.Protocol):
    """One accepted connection: sniffs the protocol, then hands bytes to that side."""

    def __init__(self, state: LupineState, live: set[asyncio.Transport]) -> None:
        self._state = state
        self._live = live
        # Bytes seen before the protocol is known; ``None`` once a side owns the stream.
        self._pending: bytes | None = b""
        self._side: _Side | None = None
        self._hung = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transports implement asyncio.Transport without subclassing it.
        stream = cast(asyncio.Transport, transport)
        self._transport = stream
        if not self._admitted(stream):
            # Refused by the network, not by lupine: reset before a byte is read, as a CNI
            # rejecting the packets makes the client see it.
            self._state.refused += 1
            self._pending = None
            _reset(stream)
            return
        self._live.add(stream)
        self._state.connections += 1
        if self._state.mode == "h2only" and not self._hangs():
            # An h2-only server greets first: its SETTINGS frame goes out before it reads.
            self._side = _Http2Side(self._state, stream)

    def _admitted(self, transport: asyncio.Transport) -> bool:
        admit = self._state.admit
        if admit is None:
            return True
        peer = transport.get_extra_info("peername")
        return bool(peer) and admit(str(peer[0]))

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if self._hangs() or transport is None or transport.is_closing():
            return
        if self._pending is not None:
            self._sniff(self._pending + data, transport)
        elif self._side is not None:
            self._side.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._live.discard(self._transport)

    def _hangs(self) -> bool:
        # Once a connection hangs it stays hung, like a wedged server thread would.
        self._hung = self._hung or self._state.fault == "hang"
        return self._hung

    def _sniff(self, pending: bytes, transport: asyncio.Transport) -> None:
        seen = pending[: len(PREFACE)]
        if PREFACE.startswith(seen) and len(pending) < len(PREFACE):
            self._pending = pending
            return
        self._pending = None
        if seen == PREFACE:
            self._side = self._side or _Http2Side(self._state, transport)
        elif self._state.mode == "h2only":
            logger.debug("h2-only fake lupine got a non-HTTP/2 preface; hanging up")
            _hang_up(transport, reset=self._state.hangup == "reset")
            return
        else:
            self._side = _Http1Side(self._state, transport)
        self._side.feed(pending)


class _Http1Side:
    """Answers HTTP/1.1 probes: ``GET /`` and ``GET /metrics``, keep-alive, faults."""

    def __init__(self, state: LupineState, transport: asyncio.Transport) -> None:
        self._state = state
        self._transport = transport
        self._reader = RequestReader()

    def feed(self, data: bytes) -> None:
        try:
            requests = self._reader.feed(data)
        except MalformedRequest as exc:
            self._refuse(exc)
            return
        for request in requests:
            if self._transport.is_closing():
                return
            self._respond(request)

    def _refuse(self, exc: MalformedRequest) -> None:
        body = f"{exc}\n".encode()
        head = response_head(
            exc.status, content_type=_TEXT, content_length=len(body), keep_alive=False
        )
        self._transport.write(head + body)
        self._transport.close()

    def _respond(self, request: Request) -> None:
        status, content_type, body = _route_http1(self._state, request)
        keep_alive = request.keep_alive and self._state.fault != "truncated"
        head = response_head(
            status, content_type=content_type, content_length=len(body), keep_alive=keep_alive
        )
        if request.method == "HEAD":
            body = b""
        elif self._state.fault == "truncated":
            # Promise the whole body, send half, hang up: a server dying mid-write.
            body = body[: len(body) // 2]
        self._transport.write(head + body)
        if not keep_alive:
            self._transport.close()


def _route_http1(state: LupineState, request: Request) -> tuple[HTTPStatus, str, bytes]:
    if request.method == "GET" and request.path == "/":
        return HTTPStatus.OK, _TEXT, b"lupine\n"
    if request.method == "GET" and request.path == "/metrics":
        if state.fault == "error500":
            return HTTPStatus.INTERNAL_SERVER_ERROR, _TEXT, b"internal server error\n"
        return HTTPStatus.OK, METRICS_CONTENT_TYPE, render_metrics(state).encode()
    return HTTPStatus.NOT_FOUND, _TEXT, b"404 page not found\n"


class _Http2Side:
    """Answers HTTP/2 prior knowledge: as the released build (any request 200 with the CUDA
    version header, then a reset) in ``h2only`` mode with ``hangup="reset"``; otherwise
    ``HEAD /`` with the CUDA version header and 404 for anything else, keeping the
    connection."""

    def __init__(self, state: LupineState, transport: asyncio.Transport) -> None:
        self._state = state
        self._transport = transport
        self._released = state.mode == "h2only" and state.hangup == "reset"
        self._conn = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        self._conn.initiate_connection()
        self._flush()

    def feed(self, data: bytes) -> None:
        try:
            events = self._conn.receive_data(data)
        except ProtocolError:
            logger.debug("HTTP/2 protocol error from a probe; closing", exc_info=True)
            self._flush()
            self._transport.close()
            return
        for event in events:
            self._handle(event)
        self._flush()

    def _handle(self, event: object) -> None:
        if isinstance(event, RequestReceived) and event.stream_id is not None:
            self._respond(event.stream_id, dict(_text_headers(event.headers)))
        elif isinstance(event, DataReceived) and event.stream_id is not None:
            self._conn.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
        elif isinstance(event, ConnectionTerminated):
            self._transport.close()

    def _respond(self, stream_id: int, headers: dict[str, str]) -> None:
        if self._released:
            reply = [(":status", "200"), (VERSION_HEADER, self._state.cuda_version)]
            self._conn.send_headers(stream_id, reply, end_stream=True)
            self._flush()
            loop = asyncio.get_running_loop()
            loop.call_later(RESET_DELAY, _reset, self._transport)
            return
        found = headers.get(":method") == "HEAD" and headers.get(":path") == "/"
        reply = [(":status", "200" if found else "404"), ("server", "lupine")]
        if found:
            reply.append((VERSION_HEADER, self._state.cuda_version))
        self._conn.send_headers(stream_id, reply, end_stream=True)

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and not self._transport.is_closing():
            self._transport.write(data)


def _hang_up(transport: asyncio.Transport, *, reset: bool) -> None:
    """Close ``transport``; with ``reset``, abortively (RST, unread and unsent bytes dropped)."""
    if reset:
        _reset(transport)
    else:
        transport.close()


def _reset(transport: asyncio.Transport) -> None:
    """Reset the connection as the released build does: ``SO_LINGER{1,0}``, then close."""
    if transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except OSError:
            logger.debug("could not set SO_LINGER; the hang-up may be a clean close")
    transport.abort()


def _text_headers(headers: object) -> list[tuple[str, str]]:
    pairs = headers if isinstance(headers, list) else []
    return [(str(name), str(value)) for name, value in pairs]
