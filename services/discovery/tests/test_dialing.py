"""The probe dialer over real loopback sockets: IP literals without Happy Eyeballs, names with."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import anyio
import pytest
from anyio.abc import SocketStream

from rgpu_discovery.dialing import dial_tcp

pytestmark = pytest.mark.anyio


async def _echo(stream: SocketStream) -> None:
    async with stream:
        try:
            await stream.send(b"got " + await stream.receive())
        except anyio.EndOfStream:
            pass


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, _echo)
        yield listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.cancel_scope.cancel()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_connection_to_a_listening_port_carries_bytes_both_ways(
    echo_port: int, host: str
) -> None:
    stream = await dial_tcp(host, echo_port)
    async with stream:
        await stream.send(b"ping")
        assert await stream.receive() == b"got ping"


async def test_an_ip_literal_connection_sends_small_writes_at_once(echo_port: int) -> None:
    stream = await dial_tcp("127.0.0.1", echo_port)
    async with stream:
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


async def test_a_refused_connection_raises_an_os_error() -> None:
    port = _closed_port()
    with pytest.raises(OSError, match="refused"):
        await dial_tcp("127.0.0.1", port)
