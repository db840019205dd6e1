"""uvicorn's httptools protocol with a request head that is bounded in bytes and in time.

httptools parses whatever it is fed and gathers a URL or a header value that arrives in pieces
by concatenation: 128 MiB of headers were read whole (32 s of CPU, +255 MiB), and a value
dripped a byte at a time costs time quadratic in its length. So ``GuardedHttp`` feeds the
parser the first read of a head at once (garbage is still refused at once), holds later pieces
in a buffer until the blank line that ends the head has arrived, and feeds them in one go:
every head is parsed in at most two calls. A head longer than ``max_header_bytes`` is answered
431 and the connection closed, without parsing the excess; a head still incomplete when its
``Seat``'s deadline passes is answered 408 and closed. Bytes after a head (the body) pass
straight through, bounded per route by ``_bodylimit``.

A head pipelined behind a request in the same read is counted from the next read on: the limit
holds to within one read (at most 256 KiB).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from rgpu_contracts import ErrorBody

from ._lobby import Seat

__all__ = ["GuardedHttp"]

_END_OF_HEAD = b"\r\n\r\n"
_STATUS = {408: b"408 Request Timeout", 431: b"431 Request Header Fields Too Large"}


class GuardedHttp(HttpToolsProtocol):
    """One connection's HTTP, its heads limited by its listener's ``ListenerLimits``."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        *,
        seat: Seat,
        max_header_bytes: int,
        header_seconds: float,
    ) -> None:
        super().__init__(config, server_state, app_state)
        self._seat = seat
        self._max_head = max_header_bytes
        self._header_seconds = header_seconds
        self._made = False
        self._head_open = True
        self._held: bytearray | None = None
        """Pieces of the current head after its first read, not yet parsed."""
        self._held_bytes = 0
        """Bytes of the current head received so far (the first read included)."""
        self._heads = 0
        """Heads completed on this connection."""
        self._tail = b""
        self._done = False
        self._extensions: dict[str, dict[object, object]] = {}

    # -- the connection ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._made = True
        self._extensions = _tls_extension(transport)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._seat.release()
        if self._made:
            super().connection_lost(exc)

    def head_expired(self) -> bool:
        """The seat's deadline passed: answer 408 and close if a head was still arriving."""
        if not self._made or not self._head_open or self._done:
            return False
        self._close_with(
            408,
            f"the request head did not arrive within {self._header_seconds:g} s; send the "
            "request line and headers at once (the limit is RGPU_HTTP_HEADER_SECONDS)",
        )
        return True

    # -- bytes in --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        if not self._head_open:
            super().data_received(data)
            return
        # A kept-alive connection's next request: its deadline starts with its first byte,
        # and uvicorn's idle timer stops even while the head is held here.
        self._unset_keepalive_if_required()
        self._seat.arm()
        if self._held is None:
            self._first_read(data)
        else:
            self._later_read(data)

    def _first_read(self, data: bytes) -> None:
        end = data.find(_END_OF_HEAD)
        if (len(data) if end < 0 else end + len(_END_OF_HEAD)) > self._max_head:
            self._too_large()
            return
        self._held_bytes = len(data)
        self._tail = data[-3:]
        heads = self._heads
        super().data_received(data)
        # Still the same head, not finished: hold what follows. (The read may also have
        # finished this request and begun the next; that one starts fresh with the next read.)
        if self._heads == heads and not self._done and not self.transport.is_closing():
            self._held = bytearray()

    def _later_read(self, data: bytes) -> None:
        assert self._held is not None
        window = self._tail + data
        end = window.find(_END_OF_HEAD)
        head = self._held_bytes + (
            len(data) if end < 0 else end + len(_END_OF_HEAD) - len(self._tail)
        )
        if head > self._max_head:
            self._too_large()
            return
        self._held += data
        if end < 0:
            self._held_bytes += len(data)
            self._tail = window[-3:]
            return
        pending, self._held = bytes(self._held), None
        super().data_received(pending)

    # -- parser callbacks ------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._extensions:
            self.scope["extensions"] = self._extensions

    def on_headers_complete(self) -> None:
        self._heads += 1
        self._head_open = False
        self._held = None
        self._seat.disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_open = True
        self._held = None

    # -- refusals --------------------------------------------------------------------------------

    def _too_large(self) -> None:
        self._seat.refuse("header_bytes")
        self._close_with(
            431,
            f"the request line and headers exceed this listener's limit of {self._max_head} "
            "bytes; send smaller headers (the limit is RGPU_HTTP_MAX_HEADER_BYTES)",
        )

    def _close_with(self, status: int, message: str) -> None:
        self._done = True
        self._held = None
        code = "header_timeout" if status == 408 else "header_too_large"
        body = orjson.dumps(ErrorBody(code=code, message=message, retryable=False).to_dict())
        head = (
            b"HTTP/1.1 " + _STATUS[status] + b"\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
        )
        if not self.transport.is_closing():
            self.transport.write(head + body)
            self.transport.close()


def _tls_extension(transport: asyncio.BaseTransport) -> dict[str, dict[object, object]]:
    """The ASGI ``tls`` extension, so a face can tell a verified client certificate."""
    ssl_object = transport.get_extra_info("ssl_object")
    if not isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
        return {}
    der = ssl_object.getpeercert(binary_form=True)
    chain = [ssl.DER_cert_to_PEM_cert(der)] if der else []
    return {
        "tls": {
            "server_cert": None,
            "client_cert_chain": chain,
            "client_cert_name": None,
            "client_cert_error": None,
            "tls_version": None,
            "cipher_suite": None,
        }
    }
