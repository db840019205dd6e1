"""A client shim of another CUDA major version fails only at run time, inside the pod; lupine
says which CUDA it serves in the ``x-lupine-cuda-version`` header of its answer to an HTTP/2
``HEAD /``, so discovery asks, and the fleet shows it.

The released build answers any HTTP/2 request with a bare reply and resets the connection
about 0.2 ms later, and an ordinary HTTP/2 client loses that reply (it reuses the connection,
or fails acknowledging SETTINGS after the reset). So the question is asked the way the probe
is: one fresh connection, the client preface, SETTINGS and the ``HEAD /`` written at once,
then nothing more is sent — no SETTINGS acknowledgement, no window update — and the answer is
read from whatever arrives before the reset or the timeout. Every connection costs the GPU
host a process, so how often this runs is ``versions``'s business, not this module's.

Like the probe, this never raises for network or protocol failures: the result is a value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import anyio
from anyio.abc import ByteStream
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import ConnectionTerminated, ResponseReceived, StreamReset
from h2.exceptions import H2Error

from rgpu_contracts.hami import split_endpoint

from .lupine import Dialer

__all__ = ["VERSION_HEADER", "VersionAnswer", "ask_cuda_version"]

VERSION_HEADER: Final = "x-lupine-cuda-version"
MAX_ANSWER_BYTES: Final = 64 << 10
"""A SETTINGS frame and one HEADERS frame are a few hundred bytes; more is not lupine."""
_VERSION: Final = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
"""What a CUDA version looks like ("12.4", "12.4.1"); anything else is not shown anywhere."""
_ERRORS: Final = (
    OSError,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)
_STREAM: Final = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionAnswer:
    """What asking one server learned: the version (``None`` when it said none usable), why
    not, and the connections it opened (0 or 1)."""

    version: str | None
    detail: str = ""
    connections: int = 0


async def ask_cuda_version(endpoint: str, *, dialer: Dialer, timeout: float) -> VersionAnswer:
    """Ask the lupine at ``endpoint`` (``host:port``) for its CUDA version over one connection,
    within ``timeout`` seconds; never raises for network or protocol failures."""
    try:
        host, port = split_endpoint(endpoint)
    except ValueError as exc:
        return VersionAnswer(version=None, detail=str(exc))
    stream: ByteStream | None = None
    with anyio.move_on_after(timeout):
        try:
            stream = await dialer(host, port)
        except OSError as exc:
            return VersionAnswer(version=None, detail=f"no connection: {exc}")
        try:
            return await _ask(stream, endpoint)
        finally:
            await _close(stream)
    opened = 0 if stream is None else 1
    return VersionAnswer(version=None, detail="no answer within the timeout", connections=opened)


async def _ask(stream: ByteStream, endpoint: str) -> VersionAnswer:
    conn = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    headers = [
        (":method", "HEAD"),
        (":scheme", "http"),
        (":authority", endpoint),
        (":path", "/"),
        ("user-agent", "rgpu-discovery"),
    ]
    conn.send_headers(_STREAM, headers, end_stream=True)
    try:
        await stream.send(conn.data_to_send())
    except _ERRORS:
        pass  # the greeting may already be here: read it anyway
    detail = await _read_answer(conn, stream)
    return _answer(detail)


async def _read_answer(conn: H2Connection, stream: ByteStream) -> str | dict[str, str]:
    """The reply's headers, or why there are none."""
    received = 0
    while received < MAX_ANSWER_BYTES:
        try:
            chunk = await stream.receive(MAX_ANSWER_BYTES)
        except _ERRORS:
            chunk = b""
        if not chunk:
            return "connection closed before the reply"
        if not received and chunk.startswith(b"HTTP/"):
            return "an HTTP/1.1 reply, not HTTP/2: this port is not lupine's"
        received += len(chunk)
        try:
            events = conn.receive_data(chunk)
        except H2Error as exc:
            return f"not an HTTP/2 reply ({type(exc).__name__})"
        for event in events:
            if isinstance(event, ResponseReceived) and event.stream_id == _STREAM:
                return {str(k): str(v) for k, v in event.headers or ()}
            if isinstance(event, StreamReset | ConnectionTerminated):
                return "the server refused the request"
    return f"more than {MAX_ANSWER_BYTES} bytes without a reply"


def _answer(found: str | dict[str, str]) -> VersionAnswer:
    if isinstance(found, str):
        return VersionAnswer(version=None, detail=found, connections=1)
    value = found.get(VERSION_HEADER, "").strip()
    if not value:
        return VersionAnswer(version=None, detail=f"no {VERSION_HEADER} header", connections=1)
    if not _VERSION.fullmatch(value):
        shown = value[:32]
        detail = f"{VERSION_HEADER} {shown!r} is not a version"
        return VersionAnswer(version=None, detail=detail, connections=1)
    return VersionAnswer(version=value, connections=1)


async def _close(stream: ByteStream) -> None:
    with anyio.CancelScope(shield=True, deadline=anyio.current_time() + 1):
        try:
            await stream.aclose()
        except _ERRORS:
            pass
