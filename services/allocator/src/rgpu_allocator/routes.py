"""The allocator's HTTP surface (DESIGN §4 and the extender's calls),
kept to reading requests and writing answers; every decision lives below.

* ``POST /v1/allocations``: ``AllocationRequest`` → ``200 Allocation`` | ``409 NoFit``
* ``POST /v1/allocations/{uid}/commit``: ``{"node": name}`` → ``200 Allocation`` with the
  Binding's annotations | ``404`` no claim | ``409`` expired or taken
* ``DELETE /v1/allocations/{uid}`` → ``204`` (idempotent)
* ``GET /v1/allocations/{uid}`` → ``200 Allocation`` | ``404``
* ``GET /v1/claims[?since=R&wait=S]`` → ``ClaimSet`` (long-poll, ``rgpu_runtime.Poll``)
* ``GET /v1/status`` → freshness of inputs and counts, for operators and the CLI
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rgpu_contracts import AllocationRequest, CommitRequest, NoFit
from rgpu_runtime import Poll, json_response, read_json, state_value

from .service import AllocatorService

__all__ = ["ROUTES", "Deps", "State", "deps"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """What handlers need from the lifespan."""

    service: AllocatorService


class State(TypedDict):
    """The allocator app's lifespan state."""

    deps: Deps


def deps(request: Request) -> Deps:
    """The lifespan's ``Deps`` for this request."""
    return state_value(request, "deps", Deps)


async def post_allocation(request: Request) -> Response:
    request_body = AllocationRequest.from_dict(await read_json(request))
    answer = await deps(request).service.allocate(request_body)
    if isinstance(answer, NoFit):
        return json_response(answer.to_dict(), 409)
    return json_response(answer.to_dict())


def _node(body: object) -> str:
    return CommitRequest.from_dict(body).node


async def post_commit(request: Request) -> Response:
    node = _node(await read_json(request))
    uid = request.path_params["uid"]
    return json_response((await deps(request).service.commit(uid, node)).to_dict())


async def delete_allocation(request: Request) -> Response:
    await deps(request).service.release(request.path_params["uid"])
    return Response(status_code=204)


async def get_allocation(request: Request) -> Response:
    return json_response(deps(request).service.get(request.path_params["uid"]).to_dict())


async def get_claims(request: Request) -> Response:
    poll = Poll.from_query(request.query_params)
    claims = await deps(request).service.claims(poll.since, poll.wait)
    return json_response(claims.to_dict(), headers={"Cache-Control": "no-store"})


async def get_status(request: Request) -> Response:
    return json_response(deps(request).service.status())


ROUTES: list[BaseRoute] = [
    Route("/v1/allocations", post_allocation, methods=["POST"]),
    Route("/v1/allocations/{uid}/commit", post_commit, methods=["POST"]),
    Route("/v1/allocations/{uid}", delete_allocation, methods=["DELETE"]),
    Route("/v1/allocations/{uid}", get_allocation, methods=["GET"]),
    Route("/v1/claims", get_claims, methods=["GET"]),
    Route("/v1/status", get_status, methods=["GET"]),
]
