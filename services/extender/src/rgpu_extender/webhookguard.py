"""The webhook listener must stay open to the whole cluster network (the apiserver's address
differs per cluster), so what reaches ``/mutate`` there is rationed before a body is read.

Three clients sending maximum-size AdmissionReviews made every honest pod creation fail with
"failed calling webhook" and readiness answer 27 s late. A review is cheap once its shape is
bounded (``reviewshape``), but a large body still costs its transfer, its decoding and its
memory; so a large review (over ``LARGE_REVIEW_BYTES``, or of undeclared length) is admitted
only while its client address has fewer than ``LARGE_PER_CLIENT`` in flight and the listener
fewer than ``LARGE_PER_LISTENER``; beyond either the answer is an immediate 429 that closes
the connection, counted as ``rgpu_http_rejected_total{reason="large_requests"}``. Honest
reviews are a few KiB: they are never rationed, and the event loop stays theirs.

Where the apiserver presents a client certificate (``RGPU_WEBHOOK_CLIENT_CA_FILE``, given to
it through its AdmissionConfiguration), ``/mutate`` answers nobody else; health stays open for
the kubelet, which has no certificate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from rgpu_contracts import ErrorBody
from rgpu_runtime import LISTENER_METRICS_STATE, ListenerMetrics

__all__ = [
    "LARGE_PER_CLIENT",
    "LARGE_PER_LISTENER",
    "LARGE_REVIEW_BYTES",
    "LargeReviews",
    "WebhookGuard",
    "webhook_guard",
]

LARGE_REVIEW_BYTES = 256 << 10
"""A review larger than this (256 KiB) is rationed; a GPU pod's review is a few KiB."""
LARGE_PER_CLIENT = 2
"""Large reviews one client address may have in flight."""
LARGE_PER_LISTENER = 4
"""Large reviews the webhook listener handles at once, whoever sends them."""

_MUTATE = "/mutate"
_MAX_LENGTH_DIGITS = 19


class LargeReviews:
    """Counts large reviews in flight, per client address and in total."""

    def __init__(self, *, per_client: int = LARGE_PER_CLIENT, total: int = LARGE_PER_LISTENER):
        self.per_client = per_client
        self.total = total
        self._by_client: Counter[str] = Counter()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def enter(self, client: str) -> str | None:
        """Take a place for ``client``; None when taken, else why not."""
        if self._by_client[client] >= self.per_client:
            return (
                f"{client} already has {self.per_client} large AdmissionReviews in flight "
                f"(over {LARGE_REVIEW_BYTES // 1024} KiB each)"
            )
        if self._in_flight >= self.total:
            return f"the webhook is handling {self.total} large AdmissionReviews already"
        self._by_client[client] += 1
        self._in_flight += 1
        return None

    def leave(self, client: str) -> None:
        self._in_flight -= 1
        self._by_client[client] -= 1
        if self._by_client[client] <= 0:
            del self._by_client[client]


class WebhookGuard:
    """ASGI middleware for the webhook listener's ``/mutate``."""

    def __init__(self, app: ASGIApp, *, require_client_cert: bool, large: LargeReviews) -> None:
        self.app = app
        self.require_client_cert = require_client_cert
        self.large = large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != _MUTATE:
            await self.app(scope, receive, send)
            return
        if self.require_client_cert and not _verified_client(scope):
            await _answer(send, 403, "client_certificate_required", _NO_CERTIFICATE)
            return
        if not _large(scope):
            await self.app(scope, receive, send)
            return
        client = _client(scope)
        refusal = self.large.enter(client)
        if refusal is not None:
            _count(scope)
            await _answer(send, 429, "too_many_large_reviews", _retry(refusal), close=True)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.large.leave(client)


def webhook_guard(*, require_client_cert: bool) -> Callable[[ASGIApp], ASGIApp]:
    """Wrap the webhook listener's app (one ``LargeReviews`` per listener)."""
    large = LargeReviews()
    return lambda app: WebhookGuard(app, require_client_cert=require_client_cert, large=large)


_NO_CERTIFICATE = (
    "this webhook answers /mutate only to a caller presenting a client certificate signed by "
    "the CA in RGPU_WEBHOOK_CLIENT_CA_FILE: configure the apiserver's AdmissionConfiguration "
    "with its client certificate for this webhook (docs/security.md)"
)


def _retry(refusal: str) -> str:
    return (
        f"{refusal}; retry shortly. The apiserver never sends reviews this large for ordinary "
        "pods: shrink the pod if this is one"
    )


def _verified_client(scope: Scope) -> bool:
    tls = (scope.get("extensions") or {}).get("tls") or {}
    return bool(tls.get("client_cert_chain"))


def _large(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            digits = value.strip()
            if not digits.isdigit() or len(digits) > _MAX_LENGTH_DIGITS:
                return True
            return int(digits) > LARGE_REVIEW_BYTES
    return True  # no declared length (chunked): it may be anything


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _count(scope: Scope) -> None:
    metrics = (scope.get("state") or {}).get(LISTENER_METRICS_STATE)
    if isinstance(metrics, ListenerMetrics):
        metrics.rejected.labels("webhook", "large_requests").inc()


async def _answer(send: Send, status: int, code: str, message: str, *, close: bool = False) -> None:
    body = orjson.dumps(ErrorBody(code=code, message=message, retryable=status == 429).to_dict())
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if close:
        headers += [(b"connection", b"close"), (b"retry-after", b"1")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
