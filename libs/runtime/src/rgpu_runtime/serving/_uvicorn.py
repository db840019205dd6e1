"""uvicorn's ``Server`` as an embedded part of a process that owns signals and stops promptly.

uvicorn installs its own signal handlers, polls its stop flag every 0.1 s and sleeps a fixed
0.1 s (then polls every 0.1 s) while shutting down. Embedded in a service that handles
signals once for every listener, or in a test that starts and stops an apiserver hundreds of
times, those fixed waits are pure latency: here a stop request wakes the loop at once and
shutdown waits for connections and tasks by polling every ``POLL_SECONDS``, with uvicorn's own
bound (``timeout_graceful_shutdown``) unchanged.

Given ``ListenerLimits``, the server accepts through a ``Lobby`` (connection caps, TLS after
admission) and speaks ``GuardedHttp`` (bounded request heads); without, it is plain uvicorn
(the simulated apiserver's choice, which must accept whatever its tests throw at it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator

import anyio
import uvicorn

from rgpu_runtime.settings import ListenerLimits

from ._guardedhttp import GuardedHttp
from ._lobby import Lobby, Seat

__all__ = ["EmbeddedServer"]

POLL_SECONDS = 0.005
TICK_SECONDS = 0.1
"""uvicorn's own housekeeping period (its date header, ``limit_max_requests``)."""


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals to its embedder and stops without fixed sleeps."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        name: str = "http",
        limits: ListenerLimits | None = None,
    ) -> None:
        super().__init__(config)
        self._stop = anyio.Event()
        self.limits = limits
        self.lobby: Lobby | None = None
        if limits is not None:
            if not config.loaded:
                config.load()
            self.lobby = Lobby(name=name, limits=limits, ssl_context=config.ssl, http=self._http)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.lobby is None:
            await super().startup(sockets)
            return
        await self.lifespan.startup()
        # The lobby accepts, admits, then opens TLS and HTTP itself.
        self.servers = [self.lobby.listen(sock) for sock in sockets or ()]  # type: ignore[misc]
        self.started = True

    def _http(self, seat: Seat) -> asyncio.Protocol:
        assert self.limits is not None
        return GuardedHttp(
            self.config,
            self.server_state,
            self.lifespan.state,
            seat=seat,
            max_header_bytes=self.limits.max_header_bytes,
            header_seconds=self.limits.header_seconds,
        )

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    def request_stop(self) -> None:
        """Stop accepting and begin the graceful shutdown now."""
        self.should_exit = True
        self._stop.set()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864_000
            with anyio.move_on_after(TICK_SECONDS):
                await self._stop.wait()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        if self.lobby is not None:
            await self.lobby.stop()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        try:
            await asyncio.wait_for(self._settle(), timeout=self.config.timeout_graceful_shutdown)
        except TimeoutError:
            for task in self.server_state.tasks:
                task.cancel(msg="graceful shutdown timed out")
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _settle(self) -> None:
        # uvicorn keeps no event for "connections and tasks are done", hence the short poll.
        while (  # noqa: ASYNC110
            self.server_state.connections or self.server_state.tasks
        ) and not self.force_exit:
            await asyncio.sleep(POLL_SECONDS)
        for server in self.servers:
            await server.wait_closed()
