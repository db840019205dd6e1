"""Routes that change shared state answer only callers the apiserver vouches for.

A guarded route (``Route(..., middleware=[require_caller()])``) reads the caller's bearer
token, asks the apiserver who it belongs to with a TokenReview for audience ``rgpu``, and
checks that username against the exact allow-list (``RGPU_ALLOWED_CALLERS``). The guard runs
before the handler reads the body, so an anonymous caller cannot make us parse anything.

It never fails open: when TokenReview cannot be reached the answer is 503 (retry), not a
pass. Verdicts are cached by a hash of the token (the token itself is never kept), for at most
``RGPU_AUTH_CACHE_SECONDS`` and never past the token's own ``exp``, in a cache of bounded
size, so a flood of made-up tokens costs memory we chose, not memory the caller chose.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from kubernetes_asyncio.client import AuthenticationV1Api
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from ._kube import KubeClient
from ._settings import Settings
from .errors import Forbidden, KubeError, KubeUnavailable, SettingsError, Unauthorized, Unavailable

__all__ = [
    "AUDIENCE",
    "CALLER_AUTH_STATE",
    "Caller",
    "CallerAuth",
    "VerdictCache",
    "caller_auth",
    "caller_of",
    "require_caller",
]

logger = logging.getLogger(__name__)

AUDIENCE = "rgpu"
"""The audience rgpu's projected tokens carry: a token minted for the apiserver (or anyone
else) is refused, and ours are worthless to them."""
CALLER_AUTH_STATE = "caller_auth"
"""The lifespan state key under which a service yields its ``CallerAuth``."""
MAX_TOKEN_CHARS = 16384
"""Projected tokens are about 1 KiB; anything far longer is refused before hashing or review."""
MAX_CACHED_VERDICTS = 4096
"""Distinct tokens remembered; a few per calling pod is normal, so this only bounds abuse."""
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
_ACCOUNTS_SETTING = "RGPU_ALLOWED_CALLERS"


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """Who a guarded request came from, as TokenReview confirmed it."""

    username: str
    """``system:serviceaccount:<namespace>:<name>`` for a ServiceAccount token."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Verdict:
    username: str | None
    """The confirmed user, or None when TokenReview refused the token."""
    reason: str
    expires: float


class VerdictCache:
    """TokenReview verdicts by token hash, each until its own expiry, least recent evicted."""

    def __init__(self, *, max_entries: int = MAX_CACHED_VERDICTS) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, _Verdict] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float) -> _Verdict | None:
        """The verdict for ``key`` if it has not expired at ``now``."""
        verdict = self._entries.get(key)
        if verdict is None:
            return None
        if now >= verdict.expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return verdict

    def put(self, key: bytes, verdict: _Verdict) -> None:
        self._entries[key] = verdict
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


class CallerAuth:
    """Decides whether a request's bearer token belongs to an allowed caller."""

    def __init__(
        self,
        *,
        kube: KubeClient | None,
        allowed: Iterable[str],
        cache_seconds: float,
        enabled: bool = True,
        clock: Callable[[], float] = time.time,
        cache: VerdictCache | None = None,
    ) -> None:
        if enabled and kube is None:
            raise SettingsError("RGPU_AUTH=tokenreview needs the Kubernetes API for TokenReview")
        self.enabled = enabled
        self.allowed = tuple(allowed)
        self.cache_seconds = cache_seconds
        self.cache = VerdictCache() if cache is None else cache
        self._kube = kube
        self._authn = None if kube is None else AuthenticationV1Api(kube.api_client)
        self._clock = clock

    async def authenticate(
        self, headers: Headers, *, action: str, allowed: tuple[str, ...] | None = None
    ) -> Caller | None:
        """The confirmed caller of a request doing ``action``; None when auth is off.

        Raises ``Unauthorized`` (no or unconfirmed token), ``Forbidden`` (confirmed but not
        allowed) or ``Unavailable`` (TokenReview unreachable: never a pass).
        """
        if not self.enabled:
            return None
        token = _bearer(headers)
        verdict = await self._verdict(token)
        if verdict.username is None:
            raise Unauthorized(
                f"{action} needs a ServiceAccount token with audience {AUDIENCE!r}; TokenReview "
                f"refused the one sent ({verdict.reason}); send the current projected token "
                "(RGPU_TOKEN_FILE, re-read as the kubelet rotates it)"
            )
        return self._allow(verdict.username, action, self.allowed if allowed is None else allowed)

    def _allow(self, username: str, action: str, allowed: tuple[str, ...]) -> Caller:
        if username in allowed:
            return Caller(username=username)
        listed = ", ".join(allowed) or "nobody"
        raise Forbidden(
            f"{username} may not {action}: allowed callers are {listed}; run the caller as "
            f"one of them, or add {username} to {_ACCOUNTS_SETTING} if it should be trusted"
        )

    async def _verdict(self, token: str) -> _Verdict:
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        cached = self.cache.get(key, now)
        if cached is not None:
            return cached
        verdict = await self._review(token, now)
        self.cache.put(key, verdict)
        return verdict

    async def _review(self, token: str, now: float) -> _Verdict:
        if self._kube is None or self._authn is None:
            raise Unavailable(
                "token review is not configured: RGPU_AUTH=tokenreview needs a Kubernetes client"
            )
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [AUDIENCE]},
        }
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

    def _judge(self, status: dict[str, Any], token: str, now: float) -> _Verdict:
        user = status.get("user") or {}
        username = user.get("username") if isinstance(user, dict) else None
        audiences = status.get("audiences") or ()
        confirmed = status.get("authenticated") is True and isinstance(username, str)
        if not confirmed or AUDIENCE not in audiences:
            reason = str(status.get("error") or "not authenticated for audience rgpu")[:300]
            return _Verdict(username=None, reason=reason, expires=now + REFUSAL_CACHE_SECONDS)
        expires = now + self.cache_seconds
        exp = _expiry(token)
        return _Verdict(
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


def _bearer(headers: Headers) -> str:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            "no bearer token: this route needs 'Authorization: Bearer <token>' with a "
            f"ServiceAccount token of audience {AUDIENCE!r}; mount the projected token and "
            "point RGPU_TOKEN_FILE at it"
        )
    if len(token) > MAX_TOKEN_CHARS:
        raise Unauthorized(
            f"the bearer token is longer than {MAX_TOKEN_CHARS} characters; send the "
            "projected ServiceAccount token"
        )
    return token


def _expiry(token: str) -> float | None:
    """The token's ``exp`` (epoch seconds), read unverified: it only shortens a cache entry."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int) and not isinstance(exp, bool) else None


class _CallerGuard:
    """ASGI middleware for one route: confirm the caller before the endpoint runs."""

    def __init__(self, app: ASGIApp, *, allowed: tuple[str, ...] | None) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            auth = (scope.get("state") or {}).get(CALLER_AUTH_STATE)
            if not isinstance(auth, CallerAuth):
                raise RuntimeError(
                    f"a guarded route needs lifespan state {CALLER_AUTH_STATE!r} holding a "
                    "CallerAuth; yield caller_auth(settings, kube) from the service's lifespan"
                )
            action = f"{scope['method']} {scope['path']}"
            headers = Headers(scope=scope)
            scope[_CALLER_SCOPE_KEY] = await auth.authenticate(
                headers, action=action, allowed=self.allowed
            )
        await self.app(scope, receive, send)


def require_caller(*, allowed: Iterable[str] | None = None) -> Middleware:
    """Route middleware that admits only confirmed, allowed callers.

    ``allowed`` narrows the route to these usernames; by default the service's
    ``RGPU_ALLOWED_CALLERS``. Use as ``Route(path, endpoint, middleware=[require_caller()])``.
    """
    return Middleware(_CallerGuard, allowed=None if allowed is None else tuple(allowed))


def caller_of(scope: Scope) -> Caller | None:
    """The caller a guard confirmed for this request (None: unguarded, or ``RGPU_AUTH=none``)."""
    caller = scope.get(_CALLER_SCOPE_KEY)
    return caller if isinstance(caller, Caller) else None


def caller_auth(
    settings: Settings, kube: KubeClient | None, *, clock: Callable[[], float] = time.time
) -> CallerAuth:
    """Build the ``CallerAuth`` the settings ask for; warns loudly when auth is off."""
    auth = settings.auth
    if auth.mode == "none":
        logger.warning(
            "RGPU_AUTH=none: %s accepts every caller on its guarded routes (anyone who can "
            "reach it may book, commit, release or probe); set RGPU_AUTH=tokenreview",
            settings.service,
        )
    elif not auth.allowed_callers:
        logger.warning(
            "RGPU_ALLOWED_CALLERS is empty: %s refuses every caller on its guarded routes (403); "
            "list the callers' accounts, e.g. system:serviceaccount:rgpu-system:rgpu-extender",
            settings.service,
        )
    return CallerAuth(
        kube=kube,
        allowed=auth.allowed_callers,
        cache_seconds=auth.cache_seconds,
        enabled=auth.mode == "tokenreview",
        clock=clock,
    )
