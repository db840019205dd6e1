"""The allocator's HTTP surface (docs/design.md §4 and the extender's calls),
kept to reading requests and writing answers; every decision lives below.

* ``POST /v1/allocations``: ``AllocationRequest`` → ``200 Allocation`` | ``409 NoFit``
* ``POST /v1/allocations/{uid}/commit``: ``{"node": name}`` → ``200 Allocation`` with the
  Binding's annotations | ``404`` no claim | ``409`` expired or taken
* ``DELETE /v1/allocations/{uid}`` → ``204`` (idempotent)
* ``GET /v1/allocations/{uid}`` → ``200 Allocation`` | ``404``
* ``GET /v1/claims[?since=R&wait=S]`` → ``ClaimSet`` (long-poll, ``rgpu_runtime.feeds.Poll``), as
  the Lease watch delivered it, its revision the watch's resourceVersion (``published``), so
  every replica means the same by a revision; with ``delta=1`` a ``ClaimsUpdate``: the
  claims of the servers changed since ``R``, the whole set marked ``full`` when ``R`` is
  older than the changelog, ``behind`` when this replica is still below ``R`` after the wait
* ``GET /v1/queue`` → ``AdmissionQueue``: the pods behind rgpu's scheduling gate in admission
  order, each with why it waits, as a pass would decide now (any replica answers the same)
* ``GET /v1/status`` → freshness of inputs and counts, for operators and the CLI

Writes answer only callers the apiserver vouches for (docs/design.md §10): commit and release are
guarded before their body is read (``require_caller``: a token of audience ``rgpu-allocator``
from an account on ``RGPU_ALLOCATION_CALLERS``, the extender's); a booking is
checked once its body says it is one, because a ``dryRun`` decides without writing and stays
open like the other reads (``rgpu explain`` asks with it). 401 without a confirmed token, 403
for an account not on the list.

Bodies are held to a limit while they stream (413 past it): commit's to a few KiB, a
booking's (candidate node names) to ``RGPU_MAX_BODY_BYTES``. Every uid, name and node name is
held to Kubernetes' own length limit (400 naming the field): nothing longer can name a real
object, and nothing unbounded reaches a Lease or a log line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rgpu_contracts import (
    MAX_NAME_CHARS,
    MAX_NAMESPACE_CHARS,
    MAX_UID_CHARS,
    AllocationRequest,
    CommitRequest,
    NoFit,
    PodRef,
)
from rgpu_placement import FleetView
from rgpu_runtime.feeds import CLAIMS_FEED, DiscoveryMirror, Poll
from rgpu_runtime.peers import CALLER_AUTH_STATE, CallerAuth, require_caller
from rgpu_runtime.serving import body_limit, json_response, read_json, state_value

from .admitting import Admitter
from .booking import Booking
from .committing import Committer
from .errors import TooLong
from .ledger import Ledger
from .pods import PodIndex
from .policy import Policy
from .published import PublishedClaims
from .waiters import Refused

__all__ = ["MAX_NAME_CHARS", "MAX_UID_CHARS", "ROUTES", "Deps", "State", "deps", "status"]

SMALL_BODY_BYTES = 4096
REVISION_HEADER = "X-Rgpu-Revision"
"""The claim-set revision an answer of ``GET /v1/claims`` reflects (as discovery's fleet)."""
"""Commit's body is one node name (at most 253 characters): anything larger is not a request
of ours. (Release reads no body at all.)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """What handlers need from the lifespan."""

    booking: Booking
    committer: Committer
    policy: Policy
    ledger: Ledger
    pods: PodIndex
    discovery: DiscoveryMirror[FleetView]
    refused: Refused
    claims: PublishedClaims
    """The claim set followers read (the Lease watch's, at its resourceVersion)."""
    admitter: Admitter


class State(TypedDict):
    """The allocator app's lifespan state (``caller_auth`` is ``CALLER_AUTH_STATE``)."""

    deps: Deps
    caller_auth: CallerAuth


def deps(request: Request) -> Deps:
    """The lifespan's ``Deps`` for this request."""
    return state_value(request, "deps", Deps)


def status(d: Deps) -> dict[str, Any]:
    """What an operator asks first: is the input fresh, how much is held."""
    view = d.discovery.view
    age = d.discovery.fleet_age()
    return {
        "granularity": d.policy.granularity,
        "fleetRevision": view.fleet.revision if view is not None else None,
        "fleetAgeSeconds": None if age is None else round(age, 3),
        "discoveryError": d.discovery.error,
        "servers": len(view.facts) if view is not None else 0,
        "leases": len(d.ledger),
        "claims": sum(len(r.claims) for r in d.ledger.leases()),
        "pods": len(d.pods),
        "refusedWaiting": len(d.refused),
        "synced": d.pods.synced and d.ledger.synced,
    }


def _bounded(field: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise TooLong(
            f"{field} is {len(value)} characters, longer than Kubernetes allows ({limit}); "
            "send the value of the real object"
        )
    return value


def _uid(request: Request) -> str:
    return _bounded("uid", request.path_params["uid"], MAX_UID_CHARS)


def _checked(request: AllocationRequest) -> AllocationRequest:
    _pod(request.pod)
    for i, node in enumerate(request.candidate_nodes):
        _bounded(f"candidateNodes[{i}]", node, MAX_NAME_CHARS)
    return request


def _pod(pod: PodRef) -> None:
    _bounded("pod.uid", pod.uid, MAX_UID_CHARS)
    _bounded("pod.name", pod.name, MAX_NAME_CHARS)
    _bounded("pod.namespace", pod.namespace, MAX_NAMESPACE_CHARS)


async def post_allocation(request: Request) -> Response:
    request_body = _checked(AllocationRequest.from_dict(await read_json(request)))
    if not request_body.dry_run:
        auth = state_value(request, CALLER_AUTH_STATE, CallerAuth)
        await auth.authenticate(
            request.headers, action="book a server (POST /v1/allocations)", route="allocation"
        )
    answer = await deps(request).booking.allocate(request_body)
    if isinstance(answer, NoFit):
        return json_response(answer.to_dict(), 409)
    return json_response(answer.to_dict())


def _node(body: object) -> str:
    return _bounded("node", CommitRequest.from_dict(body).node, MAX_NAME_CHARS)


async def post_commit(request: Request) -> Response:
    uid = _uid(request)
    node = _node(await read_json(request))
    return json_response((await deps(request).committer.commit(uid, node)).to_dict())


async def delete_allocation(request: Request) -> Response:
    await deps(request).booking.release(_uid(request))
    return Response(status_code=204)


async def get_allocation(request: Request) -> Response:
    return json_response(deps(request).booking.lookup(_uid(request)).to_dict())


async def get_claims(request: Request) -> Response:
    poll = Poll.from_query(request.query_params)
    revision, snapshot = await poll.answer(deps(request).claims.versioned)
    headers = {"Cache-Control": "no-store", REVISION_HEADER: str(revision)}
    return Response(snapshot.answer(poll), media_type="application/json", headers=headers)


async def get_queue(request: Request) -> Response:
    return json_response(deps(request).admitter.queue().to_dict())


async def get_status(request: Request) -> Response:
    return json_response(status(deps(request)))


ROUTES: list[BaseRoute] = [
    Route("/v1/allocations", post_allocation, methods=["POST"]),
    Route(
        "/v1/allocations/{uid}/commit",
        post_commit,
        methods=["POST"],
        middleware=[require_caller("allocation"), body_limit(SMALL_BODY_BYTES)],
    ),
    Route(
        "/v1/allocations/{uid}",
        delete_allocation,
        methods=["DELETE"],
        middleware=[require_caller("allocation")],
    ),
    Route("/v1/allocations/{uid}", get_allocation, methods=["GET"]),
    Route(CLAIMS_FEED.path, get_claims, methods=["GET"]),
    Route("/v1/queue", get_queue, methods=["GET"]),
    Route("/v1/status", get_status, methods=["GET"]),
]
