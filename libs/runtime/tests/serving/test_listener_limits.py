"""Every listener bounds what one client can hold, tried as an attacker would: raw sockets on a
real loopback listener (plain and TLS), the counts read from the app's own ``/metrics``.

Floods of request headers are refused at the limit with 431, heads that do not arrive in time
with 408 and a closed connection, TLS handshakes that never finish are cut, connections beyond
the listener's or one address's cap are closed as soon as they are accepted, and idle kept-alive
connections close. Honest traffic (a head in small pieces, pipelining, bodies) is unharmed.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
import trustme
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_runtime.serving import Listener, create_service_app, json_response, running
from rgpu_runtime.settings import ListenerLimits

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[False, True], ids=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """Both loops the services run on: uvloop in production, asyncio in most tests."""
    return ("asyncio", {"use_uvloop": request.param})


FAST = ListenerLimits(
    max_header_bytes=4096,
    header_seconds=0.5,
    idle_seconds=0.5,
    max_connections=16,
    max_client_connections=8,
)


@dataclass
class Served:
    url: str
    port: int
    registry: CollectorRegistry

    def rejected(self, reason: str, listener: str = "http") -> float:
        labels = {"listener": listener, "reason": reason}
        return self.registry.get_sample_value("rgpu_http_rejected_total", labels) or 0.0

    def connections(self, listener: str = "http") -> float:
        labels = {"listener": listener}
        return self.registry.get_sample_value("rgpu_http_connections", labels) or 0.0


def echo_app(registry: CollectorRegistry):  # type: ignore[no-untyped-def]
    async def echo(request: Request) -> Response:
        body = await request.body()
        return json_response({"bytes": len(body), "agent": request.headers.get("x-agent", "")})

    routes = [Route("/echo", echo, methods=["GET", "POST"])]
    return create_service_app(service="test", routes=routes, registry=registry)


@asynccontextmanager
async def serve(limits: ListenerLimits = FAST, **listener: object) -> AsyncIterator[Served]:
    registry = CollectorRegistry()
    spec = Listener(listen="127.0.0.1:0", limits=limits, **listener)  # type: ignore[arg-type]
    async with running(echo_app(registry), spec) as (url,):
        yield Served(url=url, port=int(url.rsplit(":", 1)[1]), registry=registry)


OPENED: list[asyncio.StreamWriter] = []


@pytest.fixture(autouse=True)
async def close_what_was_dialed() -> AsyncIterator[None]:
    yield
    for writer in OPENED:
        close(writer)
    OPENED.clear()
    await anyio.sleep(0.05)  # transports close their sockets on the loop's next turns


async def dial(
    port: int, *, source: str = "127.0.0.1", context: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, local_addr=(source, 0), ssl=context, server_hostname=None
    )
    OPENED.append(writer)
    return reader, writer


async def answer(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection."""
    with anyio.fail_after(timeout):
        return await reader.read()


async def answer_or_reset(reader: asyncio.StreamReader) -> bytes:
    """What the server said before closing; a client still sending may see a reset instead."""
    try:
        return await answer(reader)
    except ConnectionError:
        return b""


async def closed_by_server(reader: asyncio.StreamReader, timeout: float = 5.0) -> bool:
    with anyio.fail_after(timeout):
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass
    return True


def close(writer: asyncio.StreamWriter) -> None:
    with suppress(Exception):
        writer.close()


# -- request heads --------------------------------------------------------------------------------


async def test_headers_beyond_the_limit_are_refused_with_431_naming_the_setting() -> None:
    async with serve() as served:
        reader, writer = await dial(served.port)
        writer.write(b"GET /echo HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 8192 + b"\r\n\r\n")
        reply = await answer(reader)
        close(writer)
        assert reply.startswith(b"HTTP/1.1 431 ")
        assert b"RGPU_HTTP_MAX_HEADER_BYTES" in reply and b"4096 bytes" in reply
        assert served.rejected("header_bytes") == 1
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(f"{served.url}/echo")).status_code == 200


async def test_a_16_mib_header_flood_is_cut_at_the_limit_not_read_whole() -> None:
    async with serve() as served:
        reader, writer = await dial(served.port)
        writer.write(b"GET /echo HTTP/1.1\r\nhost: x\r\nx-pad: ")
        sent = 0
        with suppress(ConnectionError):
            for _ in range(256):
                writer.write(b"a" * 65536)
                await writer.drain()
                sent += 65536
        reply = await answer_or_reset(reader)
        close(writer)
        assert reply.startswith(b"HTTP/1.1 431 ") or reply == b""
        # The server stopped reading long before the flood ended.
        assert sent < 16 << 20
        assert served.rejected("header_bytes") == 1


async def test_a_head_dripped_past_its_deadline_gets_408_and_is_closed() -> None:
    async with serve() as served:
        reader, writer = await dial(served.port)
        reply = b""
        with suppress(ConnectionError):
            for byte in b"GET /echo HTTP/1.1\r\nhost: x\r\n":
                writer.write(bytes([byte]))
                await writer.drain()
                with anyio.move_on_after(0.05):
                    reply += await reader.read(4096)
                if reader.at_eof():
                    break
        close(writer)
        assert reply.startswith(b"HTTP/1.1 408 ")
        assert b"RGPU_HTTP_HEADER_SECONDS" in reply
        assert served.rejected("header_timeout") == 1


async def test_a_connection_that_never_sends_a_request_is_closed_at_the_deadline() -> None:
    async with serve() as served:
        reader, writer = await dial(served.port)
        assert served.connections() == 1
        assert await closed_by_server(reader)
        close(writer)
        await anyio.sleep(0.05)
        assert served.connections() == 0
        assert served.rejected("header_timeout") == 1


async def test_a_head_arriving_in_small_pieces_within_the_deadline_is_served() -> None:
    request = b"POST /echo HTTP/1.1\r\nhost: x\r\nx-agent: drip\r\ncontent-length: 5\r\n\r\nhello"
    async with serve() as served:
        reader, writer = await dial(served.port)
        for start in range(0, len(request), 3):
            writer.write(request[start : start + 3])
            await writer.drain()
            await anyio.sleep(0.001)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        close(writer)
        assert served.rejected("header_timeout") == 0


async def test_pipelined_requests_and_kept_alive_connections_are_served() -> None:
    one = b"GET /echo HTTP/1.1\r\nhost: x\r\nx-agent: a\r\n\r\n"
    async with serve() as served:
        reader, writer = await dial(served.port)
        writer.write(one + one.replace(b"x-agent: a", b"x-agent: b"))
        await writer.drain()
        replies = b""
        while replies.count(b"HTTP/1.1 200 ") < 2:
            with anyio.fail_after(5):
                replies += await reader.read(65536)
        assert b'"agent":"a"' in replies and b'"agent":"b"' in replies
        # Kept alive: a third request on the same connection, well past the first's deadline
        # would have been, is still within its own (it starts with its first byte).
        await anyio.sleep(0.3)
        writer.write(one)
        await writer.drain()
        with anyio.fail_after(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        close(writer)


async def test_bodies_larger_than_the_head_limit_pass_on_a_kept_alive_connection() -> None:
    body = b"x" * (FAST.max_header_bytes * 4)
    async with serve() as served, httpx.AsyncClient(trust_env=False) as client:
        for _ in range(3):
            reply = await client.post(f"{served.url}/echo", content=body)
            assert reply.status_code == 200 and reply.json()["bytes"] == len(body)
        assert served.rejected("header_bytes") == 0


async def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() -> None:
    async with serve() as served:
        reader, writer = await dial(served.port)
        writer.write(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
        with anyio.fail_after(5):
            await reader.readuntil(b"}")
        assert await closed_by_server(reader, timeout=3)
        close(writer)
        assert served.rejected("header_timeout") == 0


# -- connection caps ------------------------------------------------------------------------------


async def test_connections_beyond_one_addresss_cap_are_closed_at_once_and_counted() -> None:
    async with serve() as served:
        held = [await dial(served.port) for _ in range(FAST.max_client_connections)]
        await anyio.sleep(0.05)
        assert served.connections() == FAST.max_client_connections
        reader, writer = await dial(served.port)
        reply = await answer(reader, timeout=1)
        close(writer)
        assert reply.startswith(b"HTTP/1.1 503 ") or reply == b""
        assert served.rejected("client_connections") == 1
        # Another address is not held back by the first one's connections.
        other_reader, other_writer = await dial(served.port, source="127.0.0.2")
        other_writer.write(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
        with anyio.fail_after(5):
            assert (await other_reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        close(other_writer)
        for _, w in held:
            close(w)


async def test_connections_beyond_the_listeners_cap_are_closed_whatever_their_address() -> None:
    async with serve() as served:
        held = [
            await dial(served.port, source=f"127.0.0.{2 + n // 8}")
            for n in range(FAST.max_connections)
        ]
        await anyio.sleep(0.05)
        reader, writer = await dial(served.port, source="127.0.1.1")
        reply = await answer(reader, timeout=1)
        close(writer)
        assert reply.startswith(b"HTTP/1.1 503 ") or reply == b""
        assert served.rejected("listener_connections") == 1
        for _, w in held:
            close(w)
        await anyio.sleep(0.1)
        assert served.connections() == 0


async def test_a_thousand_dripping_connections_hold_no_more_than_the_cap() -> None:
    limits = ListenerLimits(header_seconds=2.5, max_connections=64, max_client_connections=32)
    async with serve(limits) as served:
        streams = []
        for n in range(1000):
            source = f"127.0.{1 + n // 250}.{n % 250 + 1}"
            with suppress(OSError):
                streams.append(await dial(served.port, source=source))
        for _, writer in streams:
            with suppress(Exception):
                writer.write(b"G")
        await anyio.sleep(0.1)
        assert served.connections() <= limits.max_connections
        refused = served.rejected("listener_connections") + served.rejected("client_connections")
        # On a busy machine the first may reach their deadline before the last are dialed,
        # and free their places: every connection was refused, cut, or is one of the cap.
        cut = served.rejected("header_timeout")
        assert refused + cut >= len(streams) - limits.max_connections
        await anyio.sleep(limits.header_seconds + 0.5)
        assert served.connections() == 0
        admitted = len(streams) - refused
        assert served.rejected("header_timeout") == admitted >= limits.max_connections


# -- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "tls.crt", directory / "tls.key"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    return ca, cert, key


def exchange(port: int, payload: bytes, context: ssl.SSLContext | None = None) -> bytes:
    """Send ``payload`` from a blocking socket (in a thread, apart from the server's loop, as
    real clients are) and read until the server closes."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    with raw if context is None else context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(payload)
        received = b""
        with suppress(ConnectionError):
            while chunk := sock.recv(65536):
                received += chunk
        return received


async def test_a_tls_handshake_that_never_finishes_is_cut_at_the_deadline(
    tls: tuple[trustme.CA, Path, Path],
) -> None:
    ca, cert, key = tls
    async with serve(ssl_certfile=str(cert), ssl_keyfile=str(key)) as served:
        # The start of a ClientHello, and nothing more: closed without a word at the deadline.
        with anyio.fail_after(3):
            assert await anyio.to_thread.run_sync(exchange, served.port, b"\x16\x03\x01") == b""
        assert served.rejected("tls_handshake") == 1
        context = ssl.create_default_context()
        ca.configure_trust(context)
        request = b"GET /echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        reply = await anyio.to_thread.run_sync(exchange, served.port, request, context)
        assert reply.startswith(b"HTTP/1.1 200 ")
        with anyio.fail_after(3):
            while served.connections():
                await anyio.sleep(0.02)


async def test_headers_beyond_the_limit_are_refused_over_tls_too(
    tls: tuple[trustme.CA, Path, Path],
) -> None:
    ca, cert, key = tls
    context = ssl.create_default_context()
    ca.configure_trust(context)
    flood = b"GET /echo HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 8192 + b"\r\n\r\n"
    async with serve(ssl_certfile=str(cert), ssl_keyfile=str(key)) as served:
        reply = await anyio.to_thread.run_sync(exchange, served.port, flood, context)
        assert reply.startswith(b"HTTP/1.1 431 ")
        assert served.rejected("header_bytes") == 1


async def test_refusals_and_connections_are_on_the_apps_own_metrics(
    tls: tuple[trustme.CA, Path, Path],
) -> None:
    async with serve() as served, httpx.AsyncClient(trust_env=False) as client:
        text = (await client.get(f"{served.url}/metrics")).text
    assert 'rgpu_http_connections{listener="http"}' in text
    assert 'rgpu_http_rejected_total{listener="http",reason="header_timeout"} 0.0' in text
