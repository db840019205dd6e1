"""The TokenRequest and TokenReview endpoints: bodies checked and answered as kube does.

Neither object is stored. TokenRequest (``serviceaccounts/<name>/token``) mints a token for an
existing account, optionally bound to a pod; TokenReview tells a service who a token belongs
to. Both refuse bad bodies with the 400/422 kube-apiserver would send, naming the field.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rgpu_kubesim.apiserver.auth import Authenticator
from rgpu_kubesim.apiserver.endpoints import _requests
from rgpu_kubesim.apiserver.endpoints._responses import json_response
from rgpu_kubesim.apiserver.storage import Storage
from rgpu_kubesim.machinery import (
    Cause,
    Entry,
    Target,
    invalid_value,
    not_supported,
    require,
    timestamp,
)
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]
AUTHENTICATION = "authentication.k8s.io/v1"
DEFAULT_EXPIRATION_SECONDS = 3600
MIN_EXPIRATION_SECONDS = 600
MAX_EXPIRATION_SECONDS = 2**32
_ACCOUNTS = require("serviceaccounts")
_PODS = require("pods")


async def _body(request: Request, kind: str) -> JsonObj:
    body = await _requests.read_object(request)
    if not isinstance(body, dict):
        raise _status.bad_request(f"the {kind} body must be a JSON object")
    spec = body.get("spec", {})
    if not isinstance(spec, dict):
        raise _status.bad_request(f"{kind}.spec must be a JSON object")
    return body


def _invalid(kind: str, name: str, causes: list[Cause]) -> None:
    if causes:
        details = {"name": name, "group": "authentication.k8s.io", "kind": kind}
        raise _status.invalid(f"{kind}.authentication.k8s.io", name, causes, details)


def _audiences(spec: JsonObj) -> tuple[str, ...]:
    audiences = spec.get("audiences") or []
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
        raise _status.bad_request("spec.audiences must be a list of strings")
    return tuple(audiences)


def _expiration(spec: JsonObj, name: str) -> int:
    seconds = spec.get("expirationSeconds", DEFAULT_EXPIRATION_SECONDS)
    if seconds is None:
        seconds = DEFAULT_EXPIRATION_SECONDS
    field = "spec.expirationSeconds"
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        _invalid("TokenRequest", name, [invalid_value(field, seconds, "must be an integer")])
    elif seconds < MIN_EXPIRATION_SECONDS:
        why = "may not specify a duration less than 10 minutes"
        _invalid("TokenRequest", name, [invalid_value(field, seconds, why)])
    elif seconds > MAX_EXPIRATION_SECONDS:
        why = "may not specify a duration larger than 2^32 seconds"
        _invalid("TokenRequest", name, [invalid_value(field, seconds, why)])
    return int(seconds)


def _bound_pod(storage: Storage, namespace: str, spec: JsonObj, name: str) -> Entry | None:
    ref = spec.get("boundObjectRef")
    if ref is None:
        return None
    if not isinstance(ref, dict):
        raise _status.bad_request("spec.boundObjectRef must be a JSON object")
    if ref.get("kind") != "Pod":
        cause = not_supported("spec.boundObjectRef.kind", ref.get("kind"), ("Pod",))
        _invalid("TokenRequest", name, [cause])
    pod = storage.get(_PODS, namespace, str(ref.get("name") or ""))
    if ref.get("uid") and ref["uid"] != pod.uid:
        why = (
            f"the UID in the bound object reference ({ref['uid']}) does not match the UID in "
            f"record ({pod.uid}). The object might have been deleted and then recreated"
        )
        raise _status.conflict(_PODS, pod.name, why)
    return pod


async def token_request(
    storage: Storage, authn: Authenticator, target: Target, request: Request
) -> Response:
    """POST serviceaccounts/<name>/token: 201 with status.token and status.expirationTimestamp."""
    namespace = target.namespace or ""
    body = await _body(request, "TokenRequest")
    spec = body.get("spec") or {}
    audiences = _audiences(spec)
    seconds = _expiration(spec, target.name)
    account = storage.get(_ACCOUNTS, namespace, target.name)
    bound = _bound_pod(storage, namespace, spec, target.name)
    issued = authn.issue(account, audiences=audiences, seconds=seconds, bound=bound)
    answer = {
        "kind": "TokenRequest",
        "apiVersion": AUTHENTICATION,
        "metadata": {"name": target.name, "namespace": namespace, "creationTimestamp": None},
        "spec": {
            "audiences": list(audiences or authn.api_audiences),
            "expirationSeconds": seconds,
            "boundObjectRef": spec.get("boundObjectRef"),
        },
        "status": {"token": issued.token, "expirationTimestamp": timestamp(issued.expires)},
    }
    return json_response(answer, 201)


async def token_review(authn: Authenticator, request: Request) -> Response:
    """POST tokenreviews: 201 with status.authenticated, user and audiences, or the error
    (who may ask is RBAC's: ``create tokenreviews``)."""
    body = await _body(request, "TokenReview")
    spec = body.get("spec") or {}
    token = spec.get("token")
    if not isinstance(token, str) or not token:
        raise _status.bad_request("token is required for TokenReview in authentication")
    review = authn.review(token, _audiences(spec))
    answer = {
        "kind": "TokenReview",
        "apiVersion": AUTHENTICATION,
        "metadata": {"creationTimestamp": None},
        "spec": {k: v for k, v in spec.items() if k in ("token", "audiences")},
        "status": review.to_status(),
    }
    return json_response(answer, 201)
