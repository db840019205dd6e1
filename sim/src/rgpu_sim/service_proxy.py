"""Replicas of a service are reached through a Kubernetes Service: one
address, connections spread over the ready endpoints by kube-proxy. This is that, on loopback:
a TCP listener that hands each new connection to the next ready replica (round robin) and
pipes bytes both ways. Being below TLS and HTTP, it serves the webhook's TLS port as well as
plain HTTP, and a client that keeps its connection alive stays on one replica until that replica
dies — as with a real Service.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
from anyio.abc import ByteStream, SocketStream, TaskStatus

from .processes import free_port

__all__ = ["ServiceProxy"]

_CHUNK = 65536


@dataclass(slots=True, kw_only=True)
class ServiceProxy:
    """One Service: ``port`` on 127.0.0.1 in front of the replicas' ports.

    ``ready`` is the endpoint list: the stack removes a replica when it kills it and adds it
    back once its ``/readyz`` answers, as the endpoints controller does with readiness probes.
    """

    name: str
    backends: tuple[int, ...]
    port: int = field(default_factory=free_port)
    ready: set[int] = field(default_factory=set)
    """Starts empty: a replica joins once its readiness probe passes."""
    scheme: str = "http"
    """What the replicas speak behind it (the proxy itself only pipes bytes)."""
    _turn: int = 0

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def _order(self) -> list[int]:
        live = [port for port in self.backends if port in self.ready]
        self._turn += 1
        start = self._turn % len(live) if live else 0
        return live[start:] + live[:start]

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Accept and forward until cancelled."""
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        async with listener:
            task_status.started()
            await listener.serve(self._forward)

    async def _forward(self, client: SocketStream) -> None:
        async with client:
            upstream = await self._connect()
            if upstream is None:
                return  # no ready endpoint: the client sees the connection closed, as kube's
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(_pipe, client, upstream, tg.cancel_scope)
                await _pipe(upstream, client, tg.cancel_scope)

    async def _connect(self) -> SocketStream | None:
        for port in self._order():
            try:
                return await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                continue  # died since it was last seen ready: the next endpoint
        return None


async def _pipe(source: ByteStream, sink: ByteStream, scope: anyio.CancelScope) -> None:
    try:
        async for chunk in source:
            await sink.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    # One side ended: end both, as a proxied TCP connection does.
    scope.cancel()
