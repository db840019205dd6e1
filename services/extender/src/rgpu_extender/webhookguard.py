"""The webhook listener must stay open to the whole cluster network (the apiserver's address
differs per cluster), so ``/mutate`` there is rationed per client address, honest admission
first.

Three clients sending maximum-size AdmissionReviews made every honest pod creation fail with
"failed calling webhook" and readiness answer 27 s late: the event loop serves requests in
turn, so whatever many connections ask for at once delays everyone else. Each review therefore
passes three gates, cheapest first:

1. **Large bodies** (over ``LARGE_REVIEW_BYTES`` declared, or of undeclared length), before any
   is read: at most ``LARGE_PER_CLIENT`` in flight per client address and
   ``LARGE_PER_LISTENER`` in all; beyond, an immediate 429 (the body that follows is read and
   dropped, never kept, so the caller still sees why). This bounds the memory attackers can
   make the webhook buffer.
2. **Turns**: at most ``TURNS_PER_CLIENT`` reviews of one client address are read and decided
   at once; the others wait their turn (in order, up to ``WAIT_SECONDS``, then 429). However many
   connections an address opens, it gets the event loop a few requests at a time.
3. **Heavy reviews** (over ``HEAVY_REVIEW_VALUES`` JSON values, counted on the body before it
   is decoded): one per client address and ``HEAVY_PER_LISTENER`` in all are decoded at once,
   the rest wait likewise. Such a review costs up to ~100 ms of CPU; an honest one has a few
   hundred values and costs about a millisecond.

Refusals are counted as ``rgpu_http_rejected_total{listener="webhook"}`` with reason
``large_requests`` or ``queue_timeout``. None of this stops many attacking addresses; a
NetworkPolicy and the apiserver's client certificate do (docs/security.md).

Where the apiserver presents a client certificate (``RGPU_WEBHOOK_CLIENT_CA_FILE``, given to
it through its AdmissionConfiguration), ``/mutate`` answers nobody else; health stays open for
the kubelet, which has no certificate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rgpu_contracts import ErrorBody
from rgpu_runtime.errors import PayloadTooLarge
from rgpu_runtime.serving import LISTENER_METRICS_STATE, ListenerMetrics

from .reviewshape import count_values

__all__ = [
    "HEAVY_PER_LISTENER",
    "HEAVY_REVIEW_VALUES",
    "LARGE_PER_CLIENT",
    "LARGE_PER_LISTENER",
    "LARGE_REVIEW_BYTES",
    "REVIEW_VALUES_SCOPE",
    "TURNS_PER_CLIENT",
    "WAIT_SECONDS",
    "LargeReviews",
    "Turns",
    "WebhookGuard",
    "webhook_guard",
]

LARGE_REVIEW_BYTES = 64 << 10
"""A review declared larger than 64 KiB is large; a GPU pod's review is a few KiB."""
LARGE_PER_CLIENT = 2
LARGE_PER_LISTENER = 4
TURNS_PER_CLIENT = 4
"""Reviews of one client address read and decided at once."""
HEAVY_REVIEW_VALUES = 4096
"""A review of more JSON values is heavy (an honest GPU pod's has a few hundred)."""
HEAVY_PER_LISTENER = 2
WAIT_SECONDS = 2.0
"""How long a review may wait for its turn before a 429: well inside the apiserver's webhook
timeout (5 s in k8s/), so the caller learns why instead of timing out."""
REVIEW_VALUES_SCOPE = "rgpu.review_values"
"""Scope key under which the guard leaves the body's value count for the handler."""

_MUTATE = "/mutate"
_MAX_LENGTH_DIGITS = 19


class LargeReviews:
    """Large reviews in flight, per client address and in all; refused at once beyond."""

    def __init__(self, *, per_client: int = LARGE_PER_CLIENT, total: int = LARGE_PER_LISTENER):
        self.per_client = per_client
        self.total = total
        self._by_client: Counter[str] = Counter()
        self._in_flight = 0

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


class Busy(Exception):
    """A review waited ``WAIT_SECONDS`` without getting its turn."""


class Turns:
    """Places per client address (and, optionally, in all), waited for in order."""

    def __init__(
        self, *, per_client: int, total: int | None = None, wait_seconds: float = WAIT_SECONDS
    ) -> None:
        self.per_client = per_client
        self.wait_seconds = wait_seconds
        self._clients: dict[str, anyio.Semaphore] = {}
        self.total = total
        self._total = None if total is None else anyio.Semaphore(total)

    @asynccontextmanager
    async def turn(self, client: str, what: str) -> AsyncIterator[None]:
        """Hold a place for ``client`` while the block runs; raises ``Busy`` after waiting."""
        mine = self._clients.get(client)
        if mine is None:
            mine = self._clients[client] = anyio.Semaphore(self.per_client)
        try:
            with anyio.move_on_after(self.wait_seconds) as waited:
                await mine.acquire()
            if waited.cancelled_caught:
                raise Busy(f"{client} has {self.per_client} {what} being decided already")
            try:
                async with self._whole(what):
                    yield
            finally:
                mine.release()
        finally:
            self._forget(client, mine)

    @asynccontextmanager
    async def _whole(self, what: str) -> AsyncIterator[None]:
        if self._total is None:
            yield
            return
        with anyio.move_on_after(self.wait_seconds) as waited:
            await self._total.acquire()
        if waited.cancelled_caught:
            raise Busy(f"the webhook is deciding {self.total} {what} already")
        try:
            yield
        finally:
            self._total.release()

    def _forget(self, client: str, mine: anyio.Semaphore) -> None:
        stats = mine.statistics()
        if mine.value == self.per_client and not stats.tasks_waiting:
            self._clients.pop(client, None)


class WebhookGuard:
    """ASGI middleware for the webhook listener's ``/mutate``."""

    def __init__(self, app: ASGIApp, *, require_client_cert: bool) -> None:
        self.app = app
        self.require_client_cert = require_client_cert
        self.large = LargeReviews()
        self.turns = Turns(per_client=TURNS_PER_CLIENT)
        self.heavy = Turns(per_client=1, total=HEAVY_PER_LISTENER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != _MUTATE:
            await self.app(scope, receive, send)
            return
        if self.require_client_cert and not _verified_client(scope):
            await _answer(send, 403, "client_certificate_required", _NO_CERTIFICATE)
            return
        client = _client(scope)
        large = _large(scope)
        refusal = self.large.enter(client) if large else None
        if refusal is not None:
            _count(scope, "large_requests")
            await _answer(send, 429, "too_many_large_reviews", _retry(refusal))
            return
        try:
            await self._in_turn(client, scope, receive, send)
        except Busy as exc:
            _count(scope, "queue_timeout")
            await _answer(send, 429, "webhook_busy", _retry(str(exc)))
        except PayloadTooLarge as exc:
            await _answer(send, 413, exc.code, exc.message)
        finally:
            if large:
                self.large.leave(client)

    async def _in_turn(self, client: str, scope: Scope, receive: Receive, send: Send) -> None:
        async with self.turns.turn(client, "AdmissionReviews"):
            body = await _read_body(receive)
            values = count_values(body)
            scope[REVIEW_VALUES_SCOPE] = values
            if values <= HEAVY_REVIEW_VALUES:
                await self.app(scope, _replay(body, receive), send)
                return
            async with self.heavy.turn(client, "heavy AdmissionReviews"):
                await self.app(scope, _replay(body, receive), send)


def webhook_guard(*, require_client_cert: bool) -> Callable[[ASGIApp], ASGIApp]:
    """Wrap the webhook listener's app."""
    return lambda app: WebhookGuard(app, require_client_cert=require_client_cert)


_NO_CERTIFICATE = (
    "this webhook answers /mutate only to a caller presenting a client certificate signed by "
    "the CA in RGPU_WEBHOOK_CLIENT_CA_FILE: configure the apiserver's AdmissionConfiguration "
    "with its client certificate for this webhook (docs/security.md)"
)


def _retry(refusal: str) -> str:
    return (
        f"{refusal}; retry shortly. Honest pods make small reviews that are never held back: "
        "shrink the pod if this is one"
    )


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


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


def _count(scope: Scope, reason: str) -> None:
    metrics = (scope.get("state") or {}).get(LISTENER_METRICS_STATE)
    if isinstance(metrics, ListenerMetrics):
        metrics.rejected.labels("webhook", reason).inc()


async def _answer(send: Send, status: int, code: str, message: str) -> None:
    body = orjson.dumps(ErrorBody(code=code, message=message, retryable=status == 429).to_dict())
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 429:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
