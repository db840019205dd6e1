"""Lupine's RPC port answers plain HTTP/1.1 probes, and the fake must
speak it on a raw socket (HTTP/2 shares the port, so no ASGI server can own it). Only what a
probe needs is here: request heads, keep-alive, pipelining, and skipping request bodies.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

__all__ = ["MAX_HEAD_BYTES", "MalformedRequest", "Request", "RequestReader", "response_head"]

MAX_HEAD_BYTES: Final = 64 * 1024
_HEAD_END: Final = b"\r\n\r\n"


class MalformedRequest(Exception):
    """Raised for a request the fake refuses; ``status`` is the reply before closing."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        self.status = status
        super().__init__(reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """A parsed request head; header names are lower-cased."""

    method: str
    path: str
    version: str
    headers: dict[str, str]

    @property
    def keep_alive(self) -> bool:
        """HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 only when asked."""
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


class RequestReader:
    """Turns a byte stream into requests, discarding request bodies (probes send none)."""

    __slots__ = ("_buffer", "_skip")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skip = 0

    def feed(self, data: bytes) -> list[Request]:
        """Consume ``data``; return every request whose head is now complete.

        Raises ``MalformedRequest`` for a head that is too large or not HTTP/1.x.
        """
        self._buffer += data
        requests: list[Request] = []
        while (request := self._next()) is not None:
            requests.append(request)
        return requests

    def _next(self) -> Request | None:
        self._drop_body()
        end = self._buffer.find(_HEAD_END)
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise MalformedRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "head too large")
            return None
        head = bytes(self._buffer[:end])
        del self._buffer[: end + len(_HEAD_END)]
        request = parse_head(head)
        self._skip = _body_length(request)
        return request

    def _drop_body(self) -> None:
        dropped = min(self._skip, len(self._buffer))
        del self._buffer[:dropped]
        self._skip -= dropped


def parse_head(head: bytes) -> Request:
    """Parse a request line and headers; raises ``MalformedRequest``."""
    line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise MalformedRequest(HTTPStatus.BAD_REQUEST, f"bad request line {line[:80]!r}")
    method, target, version = parts
    return Request(
        method=method,
        path=target.split("?", 1)[0],
        version=version,
        headers=_headers(header_lines),
    )


def _headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise MalformedRequest(HTTPStatus.BAD_REQUEST, f"bad header line {line[:80]!r}")
        headers[name.lower()] = value.strip()
    return headers


def _body_length(request: Request) -> int:
    if "transfer-encoding" in request.headers:
        # A chunked body would need a decoder only to be thrown away; no probe sends one.
        raise MalformedRequest(HTTPStatus.NOT_IMPLEMENTED, "chunked request bodies")
    raw = request.headers.get("content-length", "0")
    if not (raw.isascii() and raw.isdigit()):
        raise MalformedRequest(HTTPStatus.BAD_REQUEST, f"bad content-length {raw[:20]!r}")
    return int(raw)


def response_head(
    status: HTTPStatus, *, content_type: str, content_length: int, keep_alive: bool
) -> bytes:
    """Build a response head with the headers lupine sends."""
    lines = (
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {content_length}",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
    )
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
