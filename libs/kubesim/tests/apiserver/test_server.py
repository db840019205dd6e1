"""Serving on loopback: listening sockets, URLs, startup and shutdown."""

from __future__ import annotations

import socket

import anyio
import httpx
import pytest

from rgpu_kubesim import run_apiserver
from rgpu_kubesim.apiserver.endpoints._server import listening_socket, socket_url

pytestmark = pytest.mark.anyio


def test_listening_socket_declares_tcp_so_connections_get_nodelay() -> None:
    # asyncio enables TCP_NODELAY on accepted sockets only for IPPROTO_TCP listeners; without
    # it every response waits for a delayed ACK.
    with listening_socket("127.0.0.1", 0) as sock:
        assert sock.proto == socket.IPPROTO_TCP
        assert socket_url(sock).startswith("http://127.0.0.1:")


def test_ipv6_urls_are_bracketed() -> None:
    try:
        sock = listening_socket("::1", 0)
    except OSError:
        pytest.fail("IPv6 loopback is unavailable on this machine")
    with sock:
        assert socket_url(sock, "https").startswith("https://[::1]:")


async def test_run_apiserver_serves_until_the_block_exits() -> None:
    async with run_apiserver() as sim:
        async with httpx.AsyncClient(base_url=sim.url) as client:
            assert (await client.get("/healthz")).text == "ok"
        url = sim.url
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=url) as client:
            await client.get("/healthz")


async def test_fixed_port_in_use_raises_oserror() -> None:
    with listening_socket("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="cannot listen on"):
            async with run_apiserver(port=port):
                pass


async def test_a_client_gone_before_its_body_arrived_is_no_server_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with run_apiserver() as sim:
        host, port = sim.url.removeprefix("http://").rsplit(":", 1)
        stream = await anyio.connect_tcp(host, int(port))
        await stream.send(
            b"PATCH /api/v1/namespaces/default/pods/p HTTP/1.1\r\nHost: sim\r\n"
            b"Content-Type: application/merge-patch+json\r\nContent-Length: 1000\r\n\r\n{"
        )
        await anyio.sleep(0.1)
        await stream.aclose()
        await anyio.sleep(0.2)
        async with httpx.AsyncClient(base_url=sim.url) as client:
            assert (await client.get("/healthz")).text == "ok"
    assert "Exception in ASGI application" not in caplog.text
