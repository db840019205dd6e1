"""Discovery's HTTP surface — the fleet and the topology, each readable
at once or by long-poll, and an on-demand re-probe of one server — kept apart from how the
state behind it is built.

* ``GET /v1/fleet[?since=R&wait=S]`` and ``GET /v1/topology[?since=R&wait=S]``: the ``Fleet``
  and ``Topology`` contracts; with ``since`` the request is held until the revision is past
  ``R`` or ``S`` seconds passed (``rgpu_runtime.feeds.Poll``); ``503`` before the first
  Node list.
* ``GET /v1/fleet?delta=1[&since=R&wait=S]``: a ``FleetUpdate`` instead — the servers
  changed and removed since ``R`` when the fleet's changelog reaches back to ``R``, else the
  whole fleet marked ``full``; ``behind`` when the wait ran out with this replica still
  below ``R`` (the follower came from a replica further along), never an older fleet.
* ``POST /v1/servers/{name}/probe``: probe lupine server ``name`` now, with the periodic
  probe's code and rules, and answer ``200`` with the ``Server`` contract as now published.
  The allocator calls it right before refusing a pod because of busy cards
  (docs/design.md#no-stale-refusals). A server probed less than a moment ago (0.25 s by
  default) is not probed again, and concurrent requests share the probe in flight; the
  ``X-Rgpu-Probe`` header says which happened (``probed``, ``coalesced``, ``rate_limited``).
  ``404`` for a server the fleet does not list, ``409`` for one without an endpoint, ``503``
  (retryable) before the first Node list. Only callers the apiserver vouches for may ask
  (docs/design.md §10): a ServiceAccount token of audience ``rgpu-discovery`` that TokenReview
  confirms as an account on ``RGPU_PROBE_CALLERS`` (the allocator's), checked before anything
  else; ``401`` without one, ``403`` for another account. A probe costs lupine a connection,
  so nobody else may make discovery open them on demand; the reads above stay open.

Every answer carries ``X-Rgpu-Revision``: the fleet's (or topology's) revision it reflects;
after a re-probe, the fleet revision once the probe's result was applied, so a caller can
long-poll ``/v1/fleet`` from it. Fleet and topology bodies are the published snapshots'
cached JSON (``rgpu_runtime.feeds.Published``), so fifty waiters woken by one change cost one
serialisation, not fifty.

A 5,000-server fleet is 10 MB of JSON, sent to every long-poll waiter on every change; gzip
cuts that twentyfold, but only for clients that said they can read it (``Accept-Encoding``,
RFC 9110 §12.5.3), and never for one that refused it with ``q=0``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypedDict, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rgpu_runtime.feeds import FLEET_FEED, TOPOLOGY_FEED, Poll, Published, Versioned
from rgpu_runtime.peers import CallerAuth, require_caller
from rgpu_runtime.serving import state_value

from .errors import NotListedYet
from .fleet import FleetState
from .probing import Reprober
from .topology import TopologyState

__all__ = ["ROUTES", "Deps", "State", "accepts_gzip", "deps"]

REVISION_HEADER = "X-Rgpu-Revision"
PROBE_HEADER = "X-Rgpu-Probe"
GZIP_MIN_BYTES = 4096
"""Below this, compressing saves less than its header and CPU cost."""
V = TypeVar("V")


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """What handlers need from the lifespan."""

    fleet: FleetState
    topology: TopologyState
    reprober: Reprober


class State(TypedDict):
    """The lifespan state discovery's app yields (``caller_auth`` is ``CALLER_AUTH_STATE``)."""

    deps: Deps
    caller_auth: CallerAuth


def deps(request: Request) -> Deps:
    """The lifespan's ``Deps`` for this request."""
    return state_value(request, "deps", Deps)


async def get_fleet(request: Request) -> Response:
    """``GET /v1/fleet[?since=R&wait=S&delta=1]``: the fleet (``Fleet`` contract), or with
    ``delta=1`` what changed since ``R`` (``FleetUpdate`` contract)."""
    poll = Poll.from_query(request.query_params)
    snapshot = await _answer(poll, deps(request).fleet.published, "fleet")
    return _json(request, snapshot, snapshot.answer(poll))


async def get_topology(request: Request) -> Response:
    """``GET /v1/topology[?since=R&wait=S]``: client nodes' topology (``Topology`` contract)."""
    poll = Poll.from_query(request.query_params)
    snapshot = await _answer(poll, deps(request).topology.published, "topology")
    return _json(request, snapshot, snapshot.answer(poll))


async def post_probe(request: Request) -> Response:
    """``POST /v1/servers/{name}/probe``: probe server ``name`` now; its ``Server`` after."""
    reprobed = await deps(request).reprober.reprobe(request.path_params["name"])
    headers = {
        REVISION_HEADER: str(reprobed.revision),
        PROBE_HEADER: reprobed.outcome,
        "Cache-Control": "no-store",
    }
    return Response(reprobed.server.json, headers=headers, media_type="application/json")


async def _answer(poll: Poll, published: Versioned[Published[V]], what: str) -> Published[V]:
    """The snapshot the request's long-poll gets; raises ``NotListedYet`` before the first
    list, so an empty fleet is never mistaken for "no servers"."""
    _, snapshot = await poll.answer(published)
    if not snapshot.listed:
        raise NotListedYet(what)
    return snapshot


def _json(request: Request, snapshot: Published[V], body: bytes) -> Response:
    headers = {
        REVISION_HEADER: str(snapshot.revision),
        "Cache-Control": "no-store",
        "Vary": "Accept-Encoding",
    }
    if len(body) >= GZIP_MIN_BYTES and accepts_gzip(request.headers.get("accept-encoding")):
        body = snapshot.compressed(body)
        headers["Content-Encoding"] = "gzip"
    return Response(body, headers=headers, media_type="application/json")


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header value allows a gzip-encoded answer.

    An explicit ``gzip`` (or ``x-gzip``) offer wins over ``*``; a quality of 0 refuses.
    """
    offers = dict(_offers(header or ""))
    quality = offers.get("gzip", offers.get("x-gzip", offers.get("*")))
    return quality is not None and quality > 0


def _offers(header: str) -> Iterator[tuple[str, float]]:
    for offer in header.split(","):
        coding, _, params = offer.partition(";")
        if coding.strip():
            yield coding.strip().lower(), _quality(params)


def _quality(params: str) -> float:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value)
            except ValueError:
                return 1.0
    return 1.0


ROUTES: list[BaseRoute] = [
    Route(FLEET_FEED.path, get_fleet, methods=["GET"]),
    Route(TOPOLOGY_FEED.path, get_topology, methods=["GET"]),
    Route(
        "/v1/servers/{name}/probe",
        post_probe,
        methods=["POST"],
        middleware=[require_caller("probe")],
    ),
]
