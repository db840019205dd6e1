"""Routes that change shared state answer only callers the apiserver vouches for, and only
the callers that route is for.

A guarded route (``Route(..., middleware=[require_caller("allocation")])``) reads the caller's
bearer token, asks the apiserver who it belongs to with a TokenReview for this service's own
audience (``rgpu-allocator``, ``rgpu-discovery``: ``audience_of``), and checks that username
against the route's exact allow-list (``RGPU_ALLOCATION_CALLERS`` for the allocator's writes,
``RGPU_PROBE_CALLERS`` for discovery's probe). One audience per receiving service means a token
one service receives is refused by every other: discovery cannot replay the allocator's token
at the allocator. The guard runs before the handler reads the body, so an anonymous caller
cannot make us parse anything.

It never fails open: when TokenReview cannot be reached the answer is 503 (retry), not a
pass. Verdicts are cached by a hash of the token (the token itself is never kept), for at most
``RGPU_AUTH_CACHE_SECONDS`` and never past the token's own ``exp``; tokens that cannot be for
this service are refused without a review, and the rest are reviewed within a budget
(``_tokencheck``), so a flood of made-up tokens costs memory and apiserver requests we chose.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from kubernetes_asyncio.client import AuthenticationV1Api
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from rgpu_runtime.errors import (
    Forbidden,
    KubeError,
    KubeUnavailable,
    SettingsError,
    Unauthorized,
    Unavailable,
)
from rgpu_runtime.kube import KubeClient
from rgpu_runtime.settings import Settings

from ._tokencheck import ReviewBudget, Verdict, VerdictCache, Verdicts, expiry, unreviewable

__all__ = [
    "ALLOCATOR_AUDIENCE",
    "CALLER_AUTH_STATE",
    "DISCOVERY_AUDIENCE",
    "ROUTE_CALLERS",
    "Caller",
    "CallerAuth",
    "VerdictCache",
    "Verdicts",
    "audience_of",
    "caller_auth",
    "caller_of",
    "require_caller",
]

logger = logging.getLogger(__name__)

ALLOCATOR_AUDIENCE = "rgpu-allocator"
"""The audience of tokens sent to the allocator (by the extender)."""
DISCOVERY_AUDIENCE = "rgpu-discovery"
"""The audience of tokens sent to discovery (by the allocator)."""
CALLER_AUTH_STATE = "caller_auth"
"""The lifespan state key under which a service yields its ``CallerAuth``."""
ROUTE_CALLERS = {"allocation": "RGPU_ALLOCATION_CALLERS", "probe": "RGPU_PROBE_CALLERS"}
"""Each kind of guarded route and the setting that lists who may call it."""
MAX_TOKEN_CHARS = 16384
"""Projected tokens are about 1 KiB; anything far longer is refused before hashing or review."""
REFUSAL_CACHE_SECONDS = 5.0
"""A refused token is re-reviewed after this long: short, so a just-created account works at
once, yet a caller retrying a bad token in a loop costs one review per interval."""
REVIEW_ATTEMPTS = 3
REVIEW_RETRY_SECONDS = 0.2
REVIEW_WAIT_LIMIT = 1.0
"""A throttled or briefly failing apiserver (429, 5xx, a timeout) is asked twice more, after its
Retry-After or 0.2 s and never more than 1 s, before the caller gets a 503: a second's delay on
one call is cheaper than a failed call the caller must retry, and a steady outage still
answers 503 within about 2 s."""

_CALLER_SCOPE_KEY = "rgpu.caller"


def audience_of(service: str) -> str:
    """The audience of tokens ``service`` accepts (``rgpu-allocator``, ``rgpu-discovery``)."""
    return f"rgpu-{service}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """Who a guarded request came from, as TokenReview confirmed it."""

    username: str
    """``system:serviceaccount:<namespace>:<name>`` for a ServiceAccount token."""


class CallerAuth:
    """Decides whether a request's bearer token belongs to a caller the route allows."""

    def __init__(
        self,
        *,
        kube: KubeClient | None,
        audience: str,
        allowed: Mapping[str, Iterable[str]],
        cache_seconds: float,
        enabled: bool = True,
        clock: Callable[[], float] = time.time,
        verdicts: Verdicts | None = None,
        budget: ReviewBudget | None = None,
    ) -> None:
        if enabled and kube is None:
            raise SettingsError("RGPU_AUTH=tokenreview needs the Kubernetes API for TokenReview")
        self.enabled = enabled
        self.audience = audience
        self.allowed = {route: tuple(users) for route, users in allowed.items()}
        self.cache_seconds = cache_seconds
        self.verdicts = Verdicts() if verdicts is None else verdicts
        self.budget = ReviewBudget() if budget is None else budget
        self.reviews = 0
        """TokenReviews asked so far (each costs the apiserver a request)."""
        self._kube = kube
        self._authn = None if kube is None else AuthenticationV1Api(kube.api_client)
        self._clock = clock

    async def authenticate(self, headers: Headers, *, action: str, route: str) -> Caller | None:
        """The confirmed caller of a request doing ``action`` on a ``route`` kind of route
        (``allocation``, ``probe``); None when auth is off.

        Raises ``Unauthorized`` (no or unconfirmed token), ``Forbidden`` (confirmed but not
        allowed on this route) or ``Unavailable`` (TokenReview unreachable or its budget
        spent: never a pass).
        """
        if not self.enabled:
            return None
        token = _bearer(headers, self.audience)
        verdict = await self._verdict(token)
        if verdict.username is None:
            raise Unauthorized(
                f"{action} needs a ServiceAccount token with audience {self.audience!r}; the one "
                f"sent is refused ({verdict.reason}); send the current projected token for this "
                "service (RGPU_TOKEN_DIR, re-read as the kubelet rotates it)"
            )
        return self._allow(verdict.username, action, route)

    def _allow(self, username: str, action: str, route: str) -> Caller:
        allowed = self.allowed.get(route, ())
        if username in allowed:
            return Caller(username=username)
        listed = ", ".join(allowed) or "nobody"
        setting = ROUTE_CALLERS.get(route, route)
        raise Forbidden(
            f"{username} may not {action}: this route's callers are {listed}; run the caller "
            f"as one of them, or add {username} to {setting} if it should be trusted"
        )

    async def _verdict(self, token: str) -> Verdict:
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        cached = self.verdicts.get(key, now)
        if cached is not None:
            return cached
        reason = unreviewable(token, self.audience, now)
        if reason is not None:
            return Verdict(username=None, reason=reason, expires=now)
        if not await self.budget.spend():
            raise Unavailable(
                "too many tokens are waiting to be confirmed (at most "
                f"{self.budget.rate:g} TokenReviews a second); retry shortly",
                retry_after=1.0,
            )
        verdict = await self._review(token, now)
        self.verdicts.put(key, verdict)
        return verdict

    async def _review(self, token: str, now: float) -> Verdict:
        if self._kube is None or self._authn is None:
            raise Unavailable(
                "token review is not configured: RGPU_AUTH=tokenreview needs a Kubernetes client"
            )
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        self.reviews += 1
        try:
            answer = await _ask(self._kube, self._authn, body)
        except KubeUnavailable as exc:
            raise Unavailable(
                f"cannot confirm the caller's token: TokenReview is unreachable ({exc.message}); "
                "retry shortly"
            ) from exc
        except KubeError as exc:
            raise Unavailable(
                f"cannot confirm the caller's token: TokenReview failed ({exc.message}); grant "
                "this service's account 'create' on tokenreviews.authentication.k8s.io",
                retryable=False,
            ) from exc
        return self._judge(answer.get("status") or {}, token, now)

    def _judge(self, status: dict[str, Any], token: str, now: float) -> Verdict:
        user = status.get("user") or {}
        username = user.get("username") if isinstance(user, dict) else None
        audiences = status.get("audiences") or ()
        confirmed = status.get("authenticated") is True and isinstance(username, str)
        if not confirmed or self.audience not in audiences:
            reason = f"not authenticated for audience {self.audience}"
            reason = str(status.get("error") or reason)[:300]
            return Verdict(username=None, reason=reason, expires=now + REFUSAL_CACHE_SECONDS)
        expires = now + self.cache_seconds
        exp = expiry(token)
        return Verdict(
            username=username, reason="", expires=expires if exp is None else min(expires, exp)
        )


async def _ask(kube: KubeClient, authn: AuthenticationV1Api, body: dict[str, Any]) -> Any:
    """The TokenReview's answer, asked again while the apiserver is briefly unavailable."""
    for _ in range(REVIEW_ATTEMPTS - 1):
        try:
            return await kube.call_raw(authn.create_token_review, body)
        except KubeUnavailable as exc:
            await anyio.sleep(min(exc.retry_after or REVIEW_RETRY_SECONDS, REVIEW_WAIT_LIMIT))
    return await kube.call_raw(authn.create_token_review, body)


def _bearer(headers: Headers, audience: str) -> str:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            "no bearer token: this route needs 'Authorization: Bearer <token>' with a "
            f"ServiceAccount token of audience {audience!r}; mount the projected token for "
            "this service under RGPU_TOKEN_DIR"
        )
    if len(token) > MAX_TOKEN_CHARS:
        raise Unauthorized(
            f"the bearer token is longer than {MAX_TOKEN_CHARS} characters; send the "
            "projected ServiceAccount token"
        )
    return token


class _CallerGuard:
    """ASGI middleware for one route: confirm the caller before the endpoint runs."""

    def __init__(self, app: ASGIApp, *, route: str) -> None:
        self.app = app
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            auth = (scope.get("state") or {}).get(CALLER_AUTH_STATE)
            if not isinstance(auth, CallerAuth):
                raise RuntimeError(
                    f"a guarded route needs lifespan state {CALLER_AUTH_STATE!r} holding a "
                    "CallerAuth; yield caller_auth(settings, kube, routes=...) from the "
                    "service's lifespan"
                )
            action = f"{scope['method']} {scope['path']}"
            headers = Headers(scope=scope)
            scope[_CALLER_SCOPE_KEY] = await auth.authenticate(
                headers, action=action, route=self.route
            )
        await self.app(scope, receive, send)


def require_caller(route: str) -> Middleware:
    """Route middleware that admits only confirmed callers on ``route``'s allow-list
    (``allocation``: ``RGPU_ALLOCATION_CALLERS``; ``probe``: ``RGPU_PROBE_CALLERS``).

    Use as ``Route(path, endpoint, middleware=[require_caller("allocation")])``.
    """
    if route not in ROUTE_CALLERS:
        known = ", ".join(sorted(ROUTE_CALLERS))
        raise ValueError(f"unknown guarded route {route!r}; expected one of {known}")
    return Middleware(_CallerGuard, route=route)


def caller_of(scope: Scope) -> Caller | None:
    """The caller a guard confirmed for this request (None: unguarded, or ``RGPU_AUTH=none``)."""
    caller = scope.get(_CALLER_SCOPE_KEY)
    return caller if isinstance(caller, Caller) else None


def caller_auth(
    settings: Settings,
    kube: KubeClient | None,
    *,
    routes: Iterable[str],
    clock: Callable[[], float] = time.time,
) -> CallerAuth:
    """Build the ``CallerAuth`` for a service guarding ``routes``; warns loudly when auth is off
    or a route's allow-list is empty."""
    auth = settings.auth
    allowed = {"allocation": auth.allocation_callers, "probe": auth.probe_callers}
    if auth.mode == "none":
        logger.warning(
            "RGPU_AUTH=none: %s accepts every caller on its guarded routes (anyone who can "
            "reach it may book, commit, release or probe); set RGPU_AUTH=tokenreview",
            settings.service,
        )
    for route in routes:
        if auth.mode != "none" and not allowed[route]:
            logger.warning(
                "%s is empty: %s refuses every caller of its %s routes (403); list the callers' "
                "accounts, e.g. system:serviceaccount:rgpu-system:rgpu-%s",
                ROUTE_CALLERS[route],
                settings.service,
                route,
                "extender" if route == "allocation" else "allocator",
            )
    return CallerAuth(
        kube=kube,
        audience=audience_of(settings.service),
        allowed=allowed,
        cache_seconds=auth.cache_seconds,
        enabled=auth.mode == "tokenreview",
        clock=clock,
    )
