"""Why this module exists: discovery's HTTP surface — the fleet and the topology, each readable
at once or by long-poll — kept apart from how the state behind it is built.

Bodies are the published snapshots' cached JSON (see ``published``), so fifty waiters woken
by one change cost one serialisation, not fifty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rgpu_runtime import state_value

from .encoding import accepts_gzip
from .fleetstate import FleetState
from .polling import Poll, answer
from .published import Published
from .topologystate import TopologyState

__all__ = ["ROUTES", "Deps", "State", "deps"]

REVISION_HEADER = "X-Rgpu-Revision"
GZIP_MIN_BYTES = 4096
"""Below this, compressing saves less than its header and CPU cost."""
V = TypeVar("V")


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """What handlers need from the lifespan."""

    fleet: FleetState
    topology: TopologyState


class State(TypedDict):
    """The lifespan state discovery's app yields."""

    deps: Deps


def deps(request: Request) -> Deps:
    """The lifespan's ``Deps`` for this request."""
    return state_value(request, "deps", Deps)


async def get_fleet(request: Request) -> Response:
    """``GET /v1/fleet[?since=R&wait=S]``: the fleet (``Fleet`` contract)."""
    poll = Poll.from_query(request.query_params)
    snapshot = await answer(deps(request).fleet.published, poll, "fleet")
    return _json(request, snapshot)


async def get_topology(request: Request) -> Response:
    """``GET /v1/topology[?since=R&wait=S]``: client nodes' topology (``Topology`` contract)."""
    poll = Poll.from_query(request.query_params)
    snapshot = await answer(deps(request).topology.published, poll, "topology")
    return _json(request, snapshot)


def _json(request: Request, snapshot: Published[V]) -> Response:
    headers = {
        REVISION_HEADER: str(snapshot.revision),
        "Cache-Control": "no-store",
        "Vary": "Accept-Encoding",
    }
    body = snapshot.body()
    if len(body) >= GZIP_MIN_BYTES and accepts_gzip(request.headers.get("accept-encoding")):
        body = snapshot.gzipped()
        headers["Content-Encoding"] = "gzip"
    return Response(body, headers=headers, media_type="application/json")


ROUTES: list[BaseRoute] = [
    Route("/v1/fleet", get_fleet, methods=["GET"]),
    Route("/v1/topology", get_topology, methods=["GET"]),
]
