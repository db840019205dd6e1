"""Who a request comes from: service-account tokens issued, reviewed and accepted as bearers.

kube-apiserver issues projected tokens through TokenRequest, answers TokenReview for services
that authenticate their own callers with them, and serves a request carrying a valid token as
that account. The simulator does the same so services run authenticated exactly as in a
cluster; a request without a token keeps the simulator's User-Agent mapping.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from rgpu_kubesim.apiserver.auth._tokens import ISSUER, TokenError, TokenSigner
from rgpu_kubesim.apiserver.storage import Storage
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import Entry, Resource, require
from rgpu_kubesim.machinery import status as _status

AUTHENTICATED_USER = "rgpu_kubesim.user"
"""The ASGI scope key under which a bearer-authenticated request carries its UserInfo."""
API_AUDIENCES = (ISSUER,)
_ACCOUNTS = require("serviceaccounts")
_PODS = require("pods")
_INVALID = "invalid bearer token"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserInfo:
    """authentication.k8s.io/v1 UserInfo of a service account."""

    username: str
    uid: str
    groups: tuple[str, ...]
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"username": self.username, "uid": self.uid}
        body["groups"] = list(self.groups)
        if self.extra:
            body["extra"] = {k: list(v) for k, v in self.extra.items()}
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class Review:
    """The outcome of reviewing a token: a user and the audiences it was valid for, or why not."""

    user: UserInfo | None = None
    audiences: tuple[str, ...] = ()
    error: str = ""

    def to_status(self) -> dict[str, Any]:
        if self.user is None:
            return {"authenticated": False, "user": {}, "error": self.error}
        status = {"authenticated": True, "user": self.user.to_dict()}
        return status | {"audiences": list(self.audiences)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Issued:
    """A freshly signed token and when it expires (epoch seconds)."""

    token: str
    expires: float


class _Refused(Exception):
    """A well-signed token that is still not valid here; the message is kube's reason."""


def _quoted(values: tuple[str, ...] | list[Any]) -> str:
    return "[" + " ".join(orjson.dumps(str(v)).decode() for v in values) + "]"


class Authenticator:
    """Issues tokens for service accounts and decides whether a presented token is valid."""

    def __init__(
        self,
        storage: Storage,
        *,
        clock: Callable[[], float],
        api_audiences: tuple[str, ...] = API_AUDIENCES,
        signer: TokenSigner | None = None,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self.api_audiences = api_audiences
        self._signer = signer or TokenSigner()

    def now(self) -> float:
        return self._clock()

    def issue(
        self, account: Entry, *, audiences: tuple[str, ...], seconds: int, bound: Entry | None
    ) -> Issued:
        now = int(self._clock())
        scoped: dict[str, Any] = {
            "namespace": account.namespace,
            "serviceaccount": {"name": account.name, "uid": account.uid},
        }
        if bound is not None:
            scoped["pod"] = {"name": bound.name, "uid": bound.uid}
        claims = {
            "aud": list(audiences or self.api_audiences),
            "exp": now + seconds,
            "iat": now,
            "iss": ISSUER,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": scoped,
            "nbf": now,
            "sub": f"system:serviceaccount:{account.namespace}:{account.name}",
        }
        return Issued(token=self._signer.sign(claims), expires=float(now + seconds))

    def review(self, token: str, audiences: tuple[str, ...] = ()) -> Review:
        """TokenReview's answer; empty ``audiences`` means the apiserver's own."""
        wanted = audiences or self.api_audiences
        try:
            claims = self._signer.verify(token)
            valid_for = self._check_claims(claims, wanted)
            user = self._user(claims)
        except (TokenError, _Refused) as exc:
            return Review(error=f"[{_INVALID}, {exc}]")
        return Review(user=user, audiences=valid_for)

    def _check_claims(self, claims: Mapping[str, Any], wanted: tuple[str, ...]) -> tuple[str, ...]:
        if claims.get("iss") != ISSUER:
            raise _Refused(f"token issuer {claims.get('iss')!r} is not {ISSUER!r}")
        now = self._clock()
        if not isinstance(claims.get("exp"), int) or now >= claims["exp"]:
            raise _Refused("service account token has expired")
        if isinstance(claims.get("nbf"), int) and now < claims["nbf"]:
            raise _Refused("service account token is not valid yet")
        aud = claims.get("aud")
        aud = list(aud) if isinstance(aud, list) else [aud]
        valid_for = tuple(a for a in wanted if a in aud)
        if not valid_for:
            why = f"token audiences {_quoted(aud)} is invalid for the target audiences"
            raise _Refused(f"{why} {_quoted(wanted)}")
        return valid_for

    def _user(self, claims: Mapping[str, Any]) -> UserInfo:
        scoped = claims.get("kubernetes.io") or {}
        namespace = str(scoped.get("namespace", ""))
        account = scoped.get("serviceaccount") or {}
        self._require_live(_ACCOUNTS, namespace, account)
        extra = {"authentication.kubernetes.io/credential-id": (f"JTI={claims.get('jti')}",)}
        pod = scoped.get("pod")
        if pod is not None:
            self._require_live(_PODS, namespace, pod)
            extra["authentication.kubernetes.io/pod-name"] = (str(pod["name"]),)
            extra["authentication.kubernetes.io/pod-uid"] = (str(pod["uid"]),)
        return UserInfo(
            username=f"system:serviceaccount:{namespace}:{account.get('name')}",
            uid=str(account.get("uid", "")),
            groups=(
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ),
            extra=extra,
        )

    def _require_live(self, resource: Resource, namespace: str, ref: Mapping[str, Any]) -> None:
        """A token dies with the object it names (deleted, or deleted and recreated)."""
        try:
            entry = self._storage.get(resource, namespace, str(ref.get("name", "")))
        except ApiError as exc:
            raise _Refused(f"{resource.plural} {namespace}/{ref.get('name')} was deleted") from exc
        if entry.uid != ref.get("uid"):
            raise _Refused(f"{resource.plural} {namespace}/{ref.get('name')} was recreated")


def _bearer(scope: Scope) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return str(token).strip()
    return None


class BearerAuth:
    """ASGI middleware: a request with a bearer token is that account's, or 401 Unauthorized."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self._app = app
        self._authn = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _bearer(scope) if scope["type"] == "http" else None
        if token is not None and not scope["path"].startswith("/_sim/"):
            review = self._authn.review(token)
            if review.user is None:
                await _unauthorized(send)
                return
            scope[AUTHENTICATED_USER] = review.user
        await self._app(scope, receive, send)


async def _unauthorized(send: Send) -> None:
    body = orjson.dumps(_status.status_body(401, "Unauthorized"))
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})
