"""Lupine servers are probed over the network, and every probe costs
the GPU host something: the released lupine server forks a process per accepted connection
and logs an error line when the connection is not a CUDA client. So a probe opens exactly one
short-lived connection, never a pooled one, and never a second one.

Two server builds answer on the same port:

* newer builds sniff the protocol and answer HTTP/1.1 ``GET /metrics`` with the usage report;
* the released build speaks only HTTP/2: it greets any connection with its HTTP/2 SETTINGS
  frame and resets the connection as soon as it sees that the client is not HTTP/2.

The probe sends one HTTP/1.1 ``GET /metrics`` and reads what comes back: an HTTP/1.1 reply is
read as usage, an HTTP/2 SETTINGS frame is proof that an HTTP/2-only build is alive (no
HTTP/2 round trip, which on that build ends in a reset that HTTP/2 clients report as a
failure), and a connection closed or reset before any byte is a failure. Whatever arrived
before a reset counts: the reset only ends the reading. Every probe is bounded by the probe
timeout, and every failure comes back as a ``ProbeOutcome`` value: this is the only module
that sees socket and HTTP parser exceptions.

Lupine reports which GPUs have clients only through its Prometheus text exposition, and a
busy set read wrongly hands an occupied server to a second tenant. Busy GPUs are the distinct
``device_uuid`` label values of the ``lupine_client_device_memory_used_bytes`` samples,
whatever their values (a client holding zero bytes is still connected). Other metrics are
skipped without being parsed; a sample of that metric whose label set cannot be read makes
the whole body unusable, because a partly read body could silently drop a busy GPU.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Final, Literal

import anyio
import anyio.to_thread
import h11
from anyio.abc import ByteStream

from rgpu_contracts.ids import GpuUuid

from .dialing import dial_tcp

__all__ = [
    "ANSWERED",
    "INLINE_PARSE_BYTES",
    "MAX_BODY_BYTES",
    "USAGE_METRIC",
    "Dialer",
    "LupineProber",
    "ProbeOutcome",
    "ProbeResult",
    "UnreadableUsage",
    "busy_gpus",
    "dial_tcp",
    "split_endpoint",
]

ProbeResult = Literal[
    "usage", "no_usage", "h2_alive", "http_error", "bad_body", "timeout", "refused", "unreachable"
]
"""``usage``: 200 with a readable busy set; ``no_usage``: 404, this build reports no usage;
``h2_alive``: an HTTP/2-only build greeted the probe with its SETTINGS frame;
``http_error``: another status; ``bad_body``: truncated, oversized or unreadable body;
``timeout``, ``refused`` (the connection could not be opened) and ``unreachable`` (the
connection closed or reset before any reply, or the reply was neither HTTP/1.1 nor HTTP/2)."""

ANSWERED: Final[frozenset[ProbeResult]] = frozenset(
    {"usage", "no_usage", "h2_alive", "http_error", "bad_body"}
)
"""Results where lupine's port answered: the server is alive, whatever it said."""

MAX_BODY_BYTES: Final = 8 << 20
"""A lupine ``/metrics`` body is a few KiB per client; 8 MiB bounds memory per probe while
leaving room for thousands of clients."""

INLINE_PARSE_BYTES: Final = 256 << 10
"""Bodies up to this size are parsed on the event loop (well under a millisecond); larger
ones in a worker thread, so one huge report never stalls every other probe and request."""

USAGE_METRIC: Final = "lupine_client_device_memory_used_bytes"

_RECEIVE_BYTES: Final = 64 << 10
_H2_FRAME_HEAD: Final = 9
_H2_SETTINGS: Final = 0x04
_RECEIVE_ERRORS: Final = (
    OSError,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)
_ESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}

Dialer = Callable[[str, int], Awaitable[ByteStream]]
"""Opens one TCP connection to ``(host, port)``; raises ``OSError`` when it cannot."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeOutcome:
    """What one probe learned; ``busy`` is meaningful only for ``usage``.

    ``connections`` is how many connections the probe opened on the server (0 when the
    connection was refused, else 1, 2 when the CUDA version was asked too): each one costs
    the GPU host a process. ``cuda_version`` is set only when it was asked and answered.
    """

    result: ProbeResult
    busy: frozenset[GpuUuid] = frozenset()
    detail: str = ""
    seconds: float = 0.0
    connections: int = 0
    cuda_version: str | None = None

    @property
    def answered(self) -> bool:
        """Whether the server's lupine port answered at all."""
        return self.result in ANSWERED


class UnreadableUsage(ValueError):
    """Raised when a usage sample's labels are malformed or lack ``device_uuid``."""


class _Truncated(Exception):
    """The body ended early or exceeded the size limit."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets) as a host and a port; raises ``ValueError``."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{endpoint!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class LupineProber:
    """Probes lupine endpoints (``host:port``), one fresh connection per probe.

    ``dialer`` opens the connections (tests point it at a scripted server); the prober keeps
    no connection between probes, so its work per probe does not grow with the fleet.
    """

    def __init__(self, *, timeout: float, dialer: Dialer = dial_tcp) -> None:
        self._timeout = timeout
        self._dialer = dialer

    async def __aenter__(self) -> LupineProber:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def probe(self, endpoint: str) -> ProbeOutcome:
        """Probe one lupine endpoint; never raises for network or protocol failures."""
        started = time.perf_counter()
        outcome = await self._probe(endpoint)
        return replace(outcome, seconds=time.perf_counter() - started)

    async def _probe(self, endpoint: str) -> ProbeOutcome:
        try:
            host, port = split_endpoint(endpoint)
        except ValueError as exc:
            return ProbeOutcome(result="unreachable", detail=str(exc))
        stream: ByteStream | None = None
        # One deadline for connecting and asking: a probe runs every few milliseconds at a
        # thousand servers, and each cancel scope costs about as much as parsing the reply.
        with anyio.move_on_after(self._timeout):
            try:
                stream = await self._dialer(host, port)
            except OSError as exc:
                return ProbeOutcome(result="refused", detail=_describe(exc))
            try:
                return replace(await _ask(stream, endpoint), connections=1)
            finally:
                await _close(stream)
        if stream is None:
            return ProbeOutcome(result="timeout", detail=f"no connection within {self._timeout} s")
        detail = "connected, but no complete answer within the probe timeout"
        return ProbeOutcome(result="timeout", detail=detail, connections=1)


async def _close(stream: ByteStream) -> None:
    """Close the probe's only connection, even when its deadline has passed."""
    with anyio.CancelScope(shield=True, deadline=anyio.current_time() + 1):
        try:
            await stream.aclose()
        except _RECEIVE_ERRORS:
            pass


async def _ask(stream: ByteStream, endpoint: str) -> ProbeOutcome:
    client = h11.Connection(our_role=h11.CLIENT)
    request = h11.Request(
        method="GET",
        target="/metrics",
        headers=[
            ("Host", endpoint),
            ("User-Agent", "rgpu-discovery"),
            ("Accept", "text/plain"),
            ("Connection", "close"),
        ],
    )
    data = client.send(request) + (client.send(h11.EndOfMessage()) or b"")
    # A server that hangs up at once may make the send fail while its greeting is already
    # on our side of the socket: read it anyway.
    try:
        await stream.send(data)
    except _RECEIVE_ERRORS:
        pass
    first = await _greeting(stream)
    if not first:
        return ProbeOutcome(result="unreachable", detail="connection closed before any reply")
    if _is_h2_settings(first):
        return ProbeOutcome(result="h2_alive", detail="HTTP/2-only build (SETTINGS greeting)")
    if not first.startswith(b"HTTP/"):
        detail = f"reply is neither HTTP/1.1 nor HTTP/2 (starts {first[:16]!r})"
        return ProbeOutcome(result="unreachable", detail=detail)
    client.receive_data(first)
    return await _read_reply(client, stream)


async def _greeting(stream: ByteStream) -> bytes:
    """At least enough bytes to tell HTTP/1.1 from an HTTP/2 frame head, or all there is."""
    data = b""
    while len(data) < _H2_FRAME_HEAD:
        chunk = await _receive(stream)
        if not chunk:
            break
        data += chunk
    return data


async def _receive(stream: ByteStream) -> bytes:
    """The next bytes; ``b""`` at the end of the stream, reset included."""
    try:
        return await stream.receive(_RECEIVE_BYTES)
    except _RECEIVE_ERRORS:
        return b""


def _is_h2_settings(data: bytes) -> bool:
    if len(data) < _H2_FRAME_HEAD or data[3] != _H2_SETTINGS:
        return False
    length = int.from_bytes(data[0:3], "big")
    stream_id = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
    return stream_id == 0 and length % 6 == 0


async def _read_reply(client: h11.Connection, stream: ByteStream) -> ProbeOutcome:
    try:
        response = await _next_event(client, stream)
    except (h11.RemoteProtocolError, _Truncated) as exc:
        return ProbeOutcome(result="unreachable", detail=f"unreadable HTTP/1.1 reply: {exc}")
    if not isinstance(response, h11.Response):
        return ProbeOutcome(result="unreachable", detail="connection closed before the reply")
    if response.status_code == 404:
        return ProbeOutcome(result="no_usage", detail="no /metrics on this lupine build")
    if response.status_code != 200:
        return ProbeOutcome(result="http_error", detail=f"/metrics answered {response.status_code}")
    try:
        return ProbeOutcome(result="usage", busy=await _parse(await _read_body(client, stream)))
    except (_Truncated, h11.RemoteProtocolError, UnicodeDecodeError, UnreadableUsage) as exc:
        return ProbeOutcome(result="bad_body", detail=f"unusable /metrics body: {exc}")


async def _next_event(client: h11.Connection, stream: ByteStream) -> object:
    """The next h11 event, receiving as needed; a reset is read as the end of the stream.

    Interim (1xx) replies are skipped: only the final reply says anything.
    """
    while (event := client.next_event()) is h11.NEED_DATA or isinstance(
        event, h11.InformationalResponse
    ):
        if event is h11.NEED_DATA:
            client.receive_data(await _receive(stream))
    return event


async def _read_body(client: h11.Connection, stream: ByteStream) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while not isinstance(event := await _next_event(client, stream), h11.EndOfMessage):
        if not isinstance(event, h11.Data):
            raise _Truncated("body cut short")
        size += len(event.data)
        if size > MAX_BODY_BYTES:
            raise _Truncated(f"body larger than {MAX_BODY_BYTES} bytes")
        chunks.append(bytes(event.data))
    return b"".join(chunks)


async def _parse(body: bytes) -> frozenset[GpuUuid]:
    if len(body) <= INLINE_PARSE_BYTES:
        return _busy(body)
    return await anyio.to_thread.run_sync(_busy, body)


def _busy(body: bytes) -> frozenset[GpuUuid]:
    return busy_gpus(body.decode("utf-8"))


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def busy_gpus(text: str) -> frozenset[GpuUuid]:
    """The GPUs with at least one client, from a lupine ``/metrics`` body.

    Raises ``UnreadableUsage`` naming the line when a usage sample cannot be read.
    """
    busy: set[GpuUuid] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith(USAGE_METRIC):
            continue
        rest = line[len(USAGE_METRIC) :]
        if rest[:1] == "{":
            busy.add(_device_uuid(rest, number))
        elif rest[:1] in (" ", "\t"):
            raise UnreadableUsage(f"line {number}: {USAGE_METRIC} sample without labels")
    return frozenset(busy)


def _device_uuid(rest: str, number: int) -> GpuUuid:
    try:
        labels = _labels(rest)
    except (IndexError, ValueError) as exc:
        raise UnreadableUsage(f"line {number}: malformed label set ({exc})") from None
    uuid = labels.get("device_uuid")
    if not uuid:
        raise UnreadableUsage(f"line {number}: {USAGE_METRIC} sample without device_uuid")
    return GpuUuid(uuid)


def _labels(text: str) -> dict[str, str]:
    """Parse ``{name="value",...}`` at the start of ``text`` (Prometheus text format 0.0.4)."""
    labels: dict[str, str] = {}
    pos = _skip_blanks(text, 1)
    while text[pos] != "}":
        eq = text.index("=", pos)
        name = text[pos:eq].strip()
        start = _skip_blanks(text, eq + 1)
        if not name or text[start] != '"':
            raise ValueError(f'expected name="value" at column {pos}')
        labels[name], pos = _quoted(text, start + 1)
        pos = _skip_blanks(text, pos)
        if text[pos] == ",":
            pos = _skip_blanks(text, pos + 1)
    return labels


def _skip_blanks(text: str, pos: int) -> int:
    while text[pos] in " \t":
        pos += 1
    return pos


def _quoted(text: str, pos: int) -> tuple[str, int]:
    """Read a label value up to its closing quote; returns the value and the next position."""
    out: list[str] = []
    while (char := text[pos]) != '"':
        if char == "\\":
            pos += 1
            out.append(_ESCAPES.get(text[pos], "\\" + text[pos]))
        else:
            out.append(char)
        pos += 1
    return "".join(out), pos + 1
