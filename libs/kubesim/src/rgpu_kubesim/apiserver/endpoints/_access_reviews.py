"""authorization.k8s.io/v1: asking the authorizer a question instead of trying the request.

``SelfSubjectAccessReview`` (what ``kubectl auth can-i`` sends) asks for the requester,
``SubjectAccessReview`` for any user and groups (cluster-scoped; ``system:auth-delegator``
grants it), ``LocalSubjectAccessReview`` for one namespace (``admin`` grants it), and
``SelfSubjectRulesReview`` (``kubectl auth can-i --list``) lists what the requester may do in
a namespace. None is stored; each is answered 201 with its ``status``, bad bodies with kube's
422 naming the field.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rgpu_kubesim.apiserver.auth import Authorizer, UserInfo
from rgpu_kubesim.apiserver.endpoints import _requests
from rgpu_kubesim.apiserver.endpoints._responses import json_response
from rgpu_kubesim.apiserver.kinds import PolicyRule
from rgpu_kubesim.apiserver.kinds import rbac as _rbac
from rgpu_kubesim.machinery import Cause, Target, invalid_value
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]
AUTHORIZATION = "authorization.k8s.io/v1"
_RESOURCE_FIELDS = ("namespace", "verb", "group", "resource", "subresource", "name")


async def review(
    authorizer: Authorizer, user: UserInfo, target: Target, request: Request
) -> Response:
    """POST of any of the four review kinds: 201 with the answer in ``status``."""
    kind = target.resource.kind
    body = await _requests.read_object(request)
    if not isinstance(body, dict) or not isinstance(body.get("spec", {}), dict):
        raise _status.bad_request(f"the {kind} body must be a JSON object with an object spec")
    spec: JsonObj = body.get("spec") or {}
    namespace = target.namespace or ""
    if kind == "SelfSubjectRulesReview":
        status = _rules_status(authorizer, user, str(spec.get("namespace") or ""))
    else:
        subject = user if kind.startswith("Self") else _subject(kind, spec)
        attrs = _attributes(kind, spec, namespace)
        allowed, reason = authorizer.explain(subject, attrs)
        status = {"allowed": allowed} | ({"reason": reason} if reason else {})
    metadata: JsonObj = {"creationTimestamp": None}
    if namespace:
        metadata["namespace"] = namespace
    answer = {"kind": kind, "apiVersion": AUTHORIZATION, "metadata": metadata}
    return json_response(answer | {"spec": spec, "status": status}, 201)


def _invalid(kind: str, causes: list[Cause]) -> None:
    if causes:
        details = {"group": "authorization.k8s.io", "kind": kind, "name": ""}
        raise _status.invalid(f"{kind}.authorization.k8s.io", "", causes, details)


def _subject(kind: str, spec: JsonObj) -> UserInfo:
    user, groups = spec.get("user") or "", spec.get("groups") or []
    if not isinstance(user, str) or not isinstance(groups, list):
        raise _status.bad_request("spec.user must be a string and spec.groups a list of strings")
    if not user and not groups:
        why = "at least one of user or group must be specified"
        _invalid(kind, [invalid_value("spec.user", user, why)])
    # Exactly the groups the review names (kube adds no system:authenticated here).
    named = tuple(str(g) for g in groups)
    return UserInfo(username=user, uid=str(spec.get("uid") or ""), groups=named)


def _attributes(kind: str, spec: JsonObj, namespace: str) -> _rbac.Request:
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if resource is not None and non_resource is not None:
        why = "cannot be specified in combination with resourceAttributes"
        _invalid(kind, [invalid_value("spec.nonResourceAttributes", "", why)])
    if isinstance(non_resource, dict) and kind != "LocalSubjectAccessReview":
        return _rbac.Request(
            verb=str(non_resource.get("verb") or ""), path=str(non_resource.get("path") or "")
        )
    if not isinstance(resource, dict):
        why = "exactly one of nonResourceAttributes or resourceAttributes must be specified"
        if kind == "LocalSubjectAccessReview":
            why = "resourceAttributes is required for a LocalSubjectAccessReview"
        _invalid(kind, [invalid_value("spec.resourceAttributes", "null", why)])
    fields = {f: str((resource or {}).get(f) or "") for f in _RESOURCE_FIELDS}
    if namespace:
        if fields["namespace"] not in ("", namespace):
            why = f"must match metadata.namespace ({namespace})"
            _invalid(
                kind, [invalid_value("spec.resourceAttributes.namespace", fields["namespace"], why)]
            )
        fields["namespace"] = namespace
    return _rbac.Request(**fields)


def _rules_status(authorizer: Authorizer, user: UserInfo, namespace: str) -> JsonObj:
    rules: list[PolicyRule] = []
    for grant in authorizer.grants(user, namespace):
        if grant.rule not in rules:
            rules.append(grant.rule)
    resource_rules = [r.to_dict() for r in rules if not r.urls]
    url_rules = [r.to_dict() for r in rules if r.urls]
    return {"resourceRules": resource_rules, "nonResourceRules": url_rules, "incomplete": False}
