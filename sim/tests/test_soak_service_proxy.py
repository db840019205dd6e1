"""The soak's Service in front of replicas: new connections go round robin to ready replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.abc import SocketStream

from rgpu_sim.service_proxy import ServiceProxy

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def _replicas(names: tuple[str, ...]) -> AsyncIterator[dict[str, int]]:
    """One TCP server per name that answers every connection with its name."""
    async with anyio.create_task_group() as tg:
        ports = {}
        for name in names:
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
            ports[name] = listener.extra(anyio.abc.SocketAttribute.local_port)

            async def answer(client: SocketStream, name: str = name) -> None:
                async with client:
                    await client.send(name.encode())

            tg.start_soon(_serve, listener, answer)
        yield ports
        tg.cancel_scope.cancel()


async def _serve(
    listener: anyio.abc.SocketListener, answer: Callable[[SocketStream], Awaitable[None]]
) -> None:
    async with listener:
        await listener.serve(answer)


async def _ask(proxy: ServiceProxy) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", proxy.port) as stream:
        try:
            return await stream.receive()
        except anyio.EndOfStream:
            return b""


async def test_connections_alternate_between_ready_replicas() -> None:
    async with _replicas(("a", "b")) as ports, anyio.create_task_group() as tg:
        proxy = ServiceProxy(name="svc", backends=(ports["a"], ports["b"]))
        proxy.ready |= {ports["a"], ports["b"]}
        await tg.start(proxy.serve)
        answers = {await _ask(proxy) for _ in range(4)}
        tg.cancel_scope.cancel()
    assert answers == {b"a", b"b"}


async def test_a_replica_taken_out_of_the_endpoints_gets_no_connection() -> None:
    async with _replicas(("a", "b")) as ports, anyio.create_task_group() as tg:
        proxy = ServiceProxy(name="svc", backends=(ports["a"], ports["b"]))
        proxy.ready |= {ports["a"], ports["b"]}
        proxy.ready.discard(ports["a"])
        await tg.start(proxy.serve)
        answers = {await _ask(proxy) for _ in range(4)}
        tg.cancel_scope.cancel()
    assert answers == {b"b"}


async def test_a_replica_not_yet_ready_gets_no_connection_and_it_is_closed() -> None:
    async with _replicas(("a",)) as ports, anyio.create_task_group() as tg:
        proxy = ServiceProxy(name="svc", backends=(ports["a"],))
        await tg.start(proxy.serve)
        assert await _ask(proxy) == b""
        tg.cancel_scope.cancel()
