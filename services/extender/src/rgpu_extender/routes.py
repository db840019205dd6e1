"""The HTTP surface — kube-scheduler's extender verbs and the admission
webhook — and nothing else; each handler reads its body, calls its verb, writes the reply.

The app holds both route lists; each listener shows only its own (``surfaces``): the verbs
on the scheduler listener, ``/mutate`` on the webhook listener.

kube-scheduler treats any non-200 from ``/filter`` or ``/bind`` as an extender failure and
loses the reason, so those two answer 200 even to an unreadable or oversized body, with the
reason in ``Error``. ``/prioritize`` has no error field (it is a bare array), and
kube-scheduler ignores a failed prioritize (the extender then adds no score, the pod still
schedules), so it answers 400 or 413 with an ``ErrorBody``. ``/mutate`` has no uid to echo
for a malformed review, so it answers 400 or 413 too.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rgpu_contracts import encode_host_priorities
from rgpu_runtime.errors import BadRequest, PayloadTooLarge
from rgpu_runtime.serving import json_response, read_json, state_value
from rgpu_runtime.telemetry import PodCreations

from .admission import AdmissionPolicy
from .binding import Binding
from .filtering import Filtering
from .instruments import ExtenderMetrics
from .pod_traces import note_binding, note_pod
from .reviewing import admit_body
from .scoring import Scoring
from .webhookguard import REVIEW_VALUES_SCOPE

__all__ = ["ROUTES", "SCHEDULER_ROUTES", "WEBHOOK_ROUTES", "Deps", "deps"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """Everything a handler may use; built by the lifespan, read by handlers via ``deps()``.

    Each verb carries the clients and stores it decides with, opened once by the lifespan, so
    a handler only reads its body, calls its verb and writes the reply.
    """

    filtering: Filtering
    scoring: Scoring
    binding: Binding
    admission: AdmissionPolicy
    metrics: ExtenderMetrics
    creations: PodCreations
    """The creations ``/filter`` saw, by pod uid, so ``/bind``'s trace links to them too."""


def deps(request: Request) -> Deps:
    """The lifespan's ``Deps``: the one way handlers reach the verbs and their clients."""
    return state_value(request, "deps", Deps)


async def filter_nodes(request: Request) -> Response:
    d = deps(request)
    verb = d.filtering
    try:
        raw = await read_json(request)
    except (BadRequest, PayloadTooLarge) as exc:
        outcome = verb.unreadable(exc.message)
    else:
        note_pod(raw, d.creations)
        outcome = await verb.filter_pod(raw)
    return json_response(outcome.result.to_dict())


async def prioritize_nodes(request: Request) -> Response:
    d = deps(request)
    raw = await read_json(request)
    note_pod(raw, d.creations)
    outcome = await d.scoring.prioritize(raw)
    return json_response(encode_host_priorities(outcome.priorities))


async def bind_pod(request: Request) -> Response:
    d = deps(request)
    verb = d.binding
    try:
        raw = await read_json(request)
    except (BadRequest, PayloadTooLarge) as exc:
        outcome = verb.unreadable(exc.message)
    else:
        note_binding(raw, d.creations)
        outcome = await verb.bind_pod(raw)
    return json_response(outcome.result.to_dict())


async def mutate_pod(request: Request) -> Response:
    d = deps(request)
    values = request.scope.get(REVIEW_VALUES_SCOPE)
    decision = admit_body(await request.body(), d.admission, d.metrics, values=values)
    return json_response(decision.review)


SCHEDULER_ROUTES: list[BaseRoute] = [
    Route("/filter", filter_nodes, methods=["POST"]),
    Route("/prioritize", prioritize_nodes, methods=["POST"]),
    Route("/bind", bind_pod, methods=["POST"]),
]
"""kube-scheduler's verbs, on the scheduler listener only."""

WEBHOOK_ROUTES: list[BaseRoute] = [Route("/mutate", mutate_pod, methods=["POST"])]
"""The admission webhook, on the webhook listener only."""

ROUTES: list[BaseRoute] = [*SCHEDULER_ROUTES, *WEBHOOK_ROUTES]
"""Every route of the app; the listeners' ``Surface`` decides which one each socket shows."""
