"""Who is asking, and whether RBAC lets them: kube-apiserver's authentication result,
impersonation and authorization for every request.

The requester is a bearer token's account; else the user ``X-Sim-User`` names (a human, in
``kubesim:users`` and any ``X-Sim-Group``; or, named ``system:serviceaccount:<ns>:<name>``,
that account with its groups); else the account a client's User-Agent maps to; else, when a
request names no one, the cluster's admin (``system:masters``), as ``kubectl proxy`` acts. Any
of them may act as another through kube's ``Impersonate-User``/``-Group``/``-Uid`` headers if
RBAC grants them ``impersonate``.

Decisions are cached per (user, groups, verb, group, resource, subresource, namespace) as the
set of object names allowed (all, some, none), and the cache is dropped with the rule index on
any RBAC write, so a request costs one dictionary lookup once its kind has been seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from rgpu_kubesim.apiserver.auth._authn import AUTHENTICATED_USER, UserInfo
from rgpu_kubesim.apiserver.auth._rbac_bootstrap import AUTHENTICATED, MASTERS
from rgpu_kubesim.apiserver.kinds import AllowedNames, Grant, RuleIndex
from rgpu_kubesim.apiserver.kinds import rbac as _rbac
from rgpu_kubesim.apiserver.storage import Change, Storage
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import Refusal, Refusals, Target, require
from rgpu_kubesim.machinery import status as _status

SIM_USERS = "kubesim:users"
"""The group of every human user named by ``X-Sim-User`` (never of a service account)."""
_CACHE_LIMIT = 65_536
_ROLES, _CLUSTER_ROLES = require("roles"), require("clusterroles")
_BINDINGS, _CLUSTER_BINDINGS = require("rolebindings"), require("clusterrolebindings")
_IMPERSONATE_EXTRA = "impersonate-extra-"


class Authorizer:
    """RBAC over the stored roles and bindings; see the module docstring."""

    def __init__(
        self,
        storage: Storage,
        *,
        default_user: str,
        user_agents: Mapping[str, str],
        refusals: Refusals | None = None,
    ) -> None:
        self._storage = storage
        self.refusals = refusals or Refusals()
        self._default_user = default_user
        self._agents = dict(user_agents)
        self._index: RuleIndex | None = None
        self._cache: dict[tuple[Any, ...], AllowedNames] = {}
        for plural in _rbac.RBAC_PLURALS:
            storage.observe(plural, self._invalidate)

    def _invalidate(self, change: Change) -> None:
        self._index = None
        self._cache.clear()

    # -- who ---------------------------------------------------------------------------------

    def requester(self, request: Request) -> UserInfo:
        """The user ``request`` acts as (impersonation applied); 403 if it may not."""
        user = self._authenticated(request)
        headers = request.headers
        if "impersonate-user" in headers or "impersonate-group" in headers:
            user = self._impersonated(user, request)
        return user

    def _authenticated(self, request: Request) -> UserInfo:
        bearer = request.scope.get(AUTHENTICATED_USER)
        if isinstance(bearer, UserInfo):
            return bearer
        named = request.headers.get("x-sim-user")
        if named:
            listed = request.headers.getlist("x-sim-group")
            return named_user(named, tuple(g.strip() for v in listed for g in v.split(",") if g))
        agent = request.headers.get("user-agent", "")
        for prefix, user in self._agents.items():
            if agent.startswith(prefix):
                return named_user(user, ())
        return UserInfo(username=self._default_user, uid="", groups=(MASTERS, AUTHENTICATED))

    def _impersonated(self, actor: UserInfo, request: Request) -> UserInfo:
        headers = request.headers
        name = headers.get("impersonate-user", "")
        asked = tuple(headers.getlist("impersonate-group"))
        if not name:
            raise _status.bad_request(
                f"requested impersonation of groups [{', '.join(asked)}] without impersonating "
                "a user; send Impersonate-User too"
            )
        for check in _impersonation_checks(name, request):
            self.require(actor, check)
        account = _rbac.service_account_of(name)
        implied = _rbac.service_account_groups(account[0]) if account else ()
        groups = (*asked, *implied)
        if name != "system:anonymous" and AUTHENTICATED not in groups:
            groups = (*groups, AUTHENTICATED)
        return UserInfo(username=name, uid=headers.get("impersonate-uid", ""), groups=groups)

    # -- whether -----------------------------------------------------------------------------

    def authorize(self, request: Request, verb: str, target: Target) -> UserInfo:
        """The requester, once RBAC allows ``verb`` on ``target``; 403 Forbidden otherwise.

        The requester is recorded on the request for admission (webhooks' ``userInfo``)."""
        user = self.requester(request)
        self.require(user, request_attributes(verb, target, request.query_params))
        request.scope[AUTHENTICATED_USER] = user
        return user

    def require(self, user: UserInfo, attrs: _rbac.Request) -> None:
        if not self.allows(user, attrs):
            error = forbidden(user, attrs)
            self.refusals.add(
                Refusal(
                    user=user.username,
                    verb=attrs.verb,
                    resource=attrs.combined if attrs.is_resource else attrs.path,
                    namespace=attrs.namespace,
                    name=attrs.name,
                    message=str(error),
                )
            )
            raise error

    def allows(self, user: UserInfo, attrs: _rbac.Request) -> bool:
        if MASTERS in user.groups:
            return True
        key = (
            user.username,
            user.groups,
            attrs.verb,
            attrs.group,
            attrs.combined,
            attrs.namespace,
            attrs.path,
        )
        try:
            names = self._cache[key]
        except KeyError:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            rules = self._rules().rules(user.username, user.groups, attrs.namespace)
            names = self._cache[key] = _rbac.allowed_names(rules, attrs)
        return names is None or attrs.name in names

    def explain(self, user: UserInfo, attrs: _rbac.Request) -> tuple[bool, str]:
        """(allowed, kube's reason) for an access review; uncached."""
        if MASTERS in user.groups:
            return True, ""
        grant = _rbac.first_allowing(self.grants(user, attrs.namespace), attrs)
        return (True, f"RBAC: allowed by {grant.source}") if grant else (False, "")

    def grants(self, user: UserInfo, namespace: str) -> Iterator[Grant]:
        """Every rule reaching ``user`` in ``namespace`` ("" for cluster scope)."""
        return self._rules().grants(user.username, user.groups, namespace)

    def _rules(self) -> RuleIndex:
        if self._index is None:
            storage = self._storage
            self._index = RuleIndex(
                cluster_roles=[e.decode() for e in storage.entries(_CLUSTER_ROLES)],
                roles=[e.decode() for e in storage.entries(_ROLES)],
                cluster_bindings=[e.decode() for e in storage.entries(_CLUSTER_BINDINGS)],
                bindings=[e.decode() for e in storage.entries(_BINDINGS)],
            )
        return self._index


def named_user(name: str, groups: tuple[str, ...]) -> UserInfo:
    """A user the simulator is told about by name: a service account carries its groups, a
    human ``kubesim:users`` and the groups named with it."""
    account = _rbac.service_account_of(name)
    implied = _rbac.service_account_groups(account[0]) if account else (SIM_USERS,)
    every = dict.fromkeys((*groups, *implied, AUTHENTICATED))
    return UserInfo(username=name, uid="", groups=tuple(every))


def _impersonation_checks(name: str, request: Request) -> list[_rbac.Request]:
    """kube's impersonation filter: ``impersonate`` on each identity asked for."""
    account = _rbac.service_account_of(name)
    if account is None:
        checks = [_rbac.Request(verb="impersonate", resource="users", name=name)]
    else:
        namespace, account_name = account
        checks = [
            _rbac.Request(
                verb="impersonate",
                resource="serviceaccounts",
                namespace=namespace,
                name=account_name,
            )
        ]
    for group in request.headers.getlist("impersonate-group"):
        checks.append(_rbac.Request(verb="impersonate", resource="groups", name=group))
    uid = request.headers.get("impersonate-uid")
    if uid:
        authn = "authentication.k8s.io"
        checks.append(_rbac.Request(verb="impersonate", group=authn, resource="uids", name=uid))
    for key, value in request.headers.items():
        if key.startswith(_IMPERSONATE_EXTRA):
            extra = key[len(_IMPERSONATE_EXTRA) :]
            checks.append(
                _rbac.Request(
                    verb="impersonate",
                    group="authentication.k8s.io",
                    resource="userextras",
                    subresource=extra,
                    name=value,
                )
            )
    return checks


def request_attributes(verb: str, target: Target, query: Mapping[str, str]) -> _rbac.Request:
    """kube's RequestInfo of a resource request, as RBAC sees it."""
    resource, subresource, name = target.resource.plural, target.subresource, target.name
    if subresource == "binding" and not name:
        resource, subresource = "bindings", ""  # POST namespaces/<ns>/bindings
    namespace = target.namespace or ""
    if resource == "namespaces" and name:
        namespace = name  # a namespace is read "in" itself: view's namespaces rule, per namespace
    if not name and verb in ("list", "watch"):
        name = selected_name(query.get("fieldSelector", ""))
    return _rbac.Request(
        verb=verb,
        group=target.resource.group,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
    )


def selected_name(field_selector: str) -> str:
    """The name a list or watch is limited to by ``metadata.name=<name>`` (kube lets RBAC's
    resourceNames restrict such a request), or ""."""
    for term in field_selector.split(","):
        key, _, value = term.strip().partition("=")
        value = value.removeprefix("=")
        if key == "metadata.name" and value and "/" not in value and value not in (".", ".."):
            return value
    return ""


def forbidden(user: UserInfo, attrs: _rbac.Request, reason: str = "") -> ApiError:
    """kube's responsewriters.Forbidden: ``<resource> "<name>" is forbidden: User ...``."""
    who = f"User {orjson.dumps(user.username).decode()} cannot {attrs.verb}"
    if not attrs.is_resource:
        message = f"forbidden: {who} path {orjson.dumps(attrs.path).decode()}"
        return _status.failure(403, message + (f": {reason}" if reason else ""), details={})
    scope = (
        f"in the namespace {orjson.dumps(attrs.namespace).decode()}"
        if attrs.namespace
        else "at the cluster scope"
    )
    why = (
        f"{who} resource {orjson.dumps(attrs.combined).decode()} in API group "
        f"{orjson.dumps(attrs.group).decode()} {scope}"
    )
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    label = f"{qualified} {orjson.dumps(attrs.name).decode()}" if attrs.name else qualified
    details: dict[str, Any] = {"name": attrs.name} if attrs.name else {}
    if attrs.group:
        details["group"] = attrs.group
    details["kind"] = attrs.resource
    message = f"{label} is forbidden: {why}" + (f": {reason}" if reason else "")
    return _status.failure(403, message, details=details)


def is_resource_path(path: str) -> bool:
    """``/api/<version>/...`` and ``/apis/<group>/<version>/...``: not a discovery document."""
    if path.startswith("/api/"):
        return path.count("/") >= 3
    return path.startswith("/apis/") and path.count("/") >= 4


class NonResourceAuthorization:
    """ASGI middleware: discovery, OpenAPI and health paths need RBAC's nonResourceURLs (every
    authenticated user has them through ``system:discovery``); resource paths are authorized
    by their handler, the simulator's ``/_sim/`` control paths by nobody."""

    def __init__(self, app: ASGIApp, authorizer: Authorizer) -> None:
        self._app = app
        self._authorizer = authorizer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and not (path.startswith("/_sim/") or is_resource_path(path)):
            request = Request(scope)
            try:
                user = self._authorizer.requester(request)
                verb = "get" if scope["method"] == "HEAD" else scope["method"].lower()
                self._authorizer.require(user, _rbac.Request(verb=verb, path=path))
            except ApiError as exc:
                await _send_error(send, exc)
                return
        await self._app(scope, receive, send)


async def _send_error(send: Send, error: ApiError) -> None:
    body = orjson.dumps(error.status)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": error.code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
