"""Services that follow discovery (the allocator, the extender, metrics, the CLI) are tested
against a discovery that the test controls: this one serves ``GET /v1/fleet`` and
``GET /v1/topology`` with discovery's long-poll rules (``rgpu_runtime.feeds.Poll`` over a
``Versioned`` value, the same code the real routes run) and ``POST /v1/servers/{name}/probe``,
from contract values the test publishes.

It is a real ASGI app: reach it in-process through ``transport`` (``httpx.ASGITransport``) or
``handler`` (for ``httpx.MockTransport`` wrappers), or on a loopback port with ``serving()``.
The served revision is the published contract's own revision, so a follower's ``since`` is
what it read in the body, as with the real service.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, TypeVar

import anyio
import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_contracts import ErrorBody, Fleet, Server, Topology
from rgpu_runtime.errors import Unavailable
from rgpu_runtime.feeds import FLEET_FEED, TOPOLOGY_FEED, Poll, Versioned
from rgpu_runtime.serving import Listener, create_service_app, running

__all__ = ["FakeDiscovery"]

REVISION_HEADER: Final = "X-Rgpu-Revision"
V = TypeVar("V", Fleet, Topology)


class FakeDiscovery:
    """Discovery's HTTP API over a fleet and a topology that the test publishes.

    * ``available = False``: every fleet and topology request is a retryable ``503``
      (``not_listed_yet``), as before discovery's first Node list.
    * ``probed[name]``: the ``Server`` a probe of ``name`` answers (default: the fleet's);
      ``probe_status`` other than 200 answers every probe with that status instead;
      ``probes`` lists the names asked for, ``polls`` counts fleet and topology requests.
    """

    def __init__(self, fleet: Fleet | None = None, topology: Topology | None = None) -> None:
        fleet = fleet if fleet is not None else Fleet(revision=1, observed_at=0.0, servers=())
        topology = topology if topology is not None else Topology(revision=1, nodes=())
        self.fleets: Versioned[Fleet] = Versioned(fleet, revision=fleet.revision)
        self.topologies: Versioned[Topology] = Versioned(topology, revision=topology.revision)
        self.available = True
        self.polls = 0
        self.probed: dict[str, Server] = {}
        self.probe_status = 200
        self.probes: list[str] = []
        self._released = False
        self._release: anyio.Event | None = None
        self.app = self._build_app()

    @property
    def fleet(self) -> Fleet:
        """The fleet served now."""
        return self.fleets.value

    @property
    def topology(self) -> Topology:
        """The topology served now."""
        return self.topologies.value

    @property
    def transport(self) -> httpx.ASGITransport:
        """A transport reaching the app in-process."""
        return httpx.ASGITransport(app=self.app)

    async def handler(self, request: httpx.Request) -> httpx.Response:
        """Answer one request through the app (for ``httpx.MockTransport`` wrappers)."""
        response = await self.transport.handle_async_request(request)
        content = await response.aread()
        return httpx.Response(response.status_code, headers=response.headers, content=content)

    def publish_fleet(self, fleet: Fleet) -> None:
        """Serve ``fleet`` at its own revision, which must be newer; wakes held polls."""
        _advance(self.fleets, fleet)

    def publish_topology(self, topology: Topology) -> None:
        """Serve ``topology`` at its own revision, which must be newer; wakes held polls."""
        _advance(self.topologies, topology)

    def publish(self, *servers: Server, topology: Topology | None = None) -> None:
        """Serve ``servers`` (when given) as the next fleet revision and ``topology`` (when
        given) as the next topology revision, whatever revision it carries."""
        if servers:
            revision = self.fleets.value.revision + 1
            self.publish_fleet(Fleet(revision=revision, observed_at=time.time(), servers=servers))
        if topology is not None:
            next_revision = self.topologies.value.revision + 1
            self.publish_topology(dataclasses.replace(topology, revision=next_revision))

    def release(self) -> None:
        """Answer every held poll now, and every later one at once (a server shutting down)."""
        self._released = True
        if self._release is not None:
            self._release.set()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        """Serve the app on an ephemeral loopback port; yields its base URL. Held polls are
        answered on exit, so the server stops at once rather than after its grace period."""
        async with running(self.app, Listener(listen="127.0.0.1:0")) as urls:
            try:
                yield urls[0]
            finally:
                self.release()
        self._released = False
        self._release = None

    def _build_app(self) -> Starlette:
        routes = [
            Route(FLEET_FEED.path, self._served(lambda: self.fleets, "fleet"), methods=["GET"]),
            Route(
                TOPOLOGY_FEED.path,
                self._served(lambda: self.topologies, "topology"),
                methods=["GET"],
            ),
            Route("/v1/servers/{name}/probe", self._probe, methods=["POST"]),
        ]
        return create_service_app(service="discovery", routes=routes)

    def _served(
        self, store: Callable[[], Versioned[V]], what: str
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            self.polls += 1
            if not self.available:
                raise _not_listed(what)
            poll = Poll.from_query(request.query_params)
            revision, value = await self._answer(poll, store())
            if not self.available:
                raise _not_listed(what)
            return _json(200, value.to_dict(), revision)

        return endpoint

    async def _answer(self, poll: Poll, store: Versioned[V]) -> tuple[int, V]:
        if self._released:
            return store.snapshot()
        self._release = self._release or anyio.Event()
        released = self._release
        async with anyio.create_task_group() as tg:

            async def cut() -> None:
                await released.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(cut)
            await poll.answer(store)
            tg.cancel_scope.cancel()
        return store.snapshot()

    async def _probe(self, request: Request) -> Response:
        name = request.path_params["name"]
        self.probes.append(name)
        fleet = self.fleets.value
        found = self.probed.get(name) or fleet.server(name)
        if found is None:
            return _error(404, "not_found", f"no server {name!r} in the fleet")
        if self.probe_status != 200:
            return _error(self.probe_status, "not_probed", f"server {name!r} was not probed")
        return _json(200, found.to_dict(), fleet.revision)


def _advance(store: Versioned[V], value: V) -> None:
    if value.revision <= store.revision:
        raise ValueError(
            f"revision {value.revision} is not newer than the served {store.revision}; "
            "publish a higher revision (followers only see a change of revision)"
        )
    # Versioned counts by one; the extra steps publish nothing a poll could see, because
    # woken polls read the snapshot only after this synchronous loop ends.
    while store.revision < value.revision - 1:
        store.publish(store.value)
    store.publish(value)


def _not_listed(what: str) -> Unavailable:
    return Unavailable(
        f"{what} not listed yet: discovery's first Node list has not succeeded; retry shortly",
        code="not_listed_yet",
        retry_after=1.0,
    )


def _json(status: int, body: object, revision: int) -> Response:
    headers = {REVISION_HEADER: str(revision), "Cache-Control": "no-store"}
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    body = ErrorBody(code=code, message=message, retryable=status >= 500).to_dict()
    return Response(orjson.dumps(body), status, media_type="application/json")
