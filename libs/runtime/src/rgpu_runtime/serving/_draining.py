"""A stopping service must be gone within seconds of SIGTERM, yet the requests
it is answering deserve to finish.

uvicorn alone waits for every request in flight, and our long-polls (``?since=R&wait=S``) are
requests that mean to sit for up to a minute: one watcher would hold the whole shutdown for its
wait. ``Draining`` wraps the app and keeps a cancel scope per request. When the service stops,
long-polls are cut at once, ordinary requests get a short deadline, and whatever is still
running then is cut too. A cut request that has not answered yet gets a retryable 503 with
``Connection: close``, so its client retries (against another replica behind a Service)
instead of reading a dropped connection as a fault.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rgpu_contracts import ErrorBody

__all__ = ["Draining", "is_long_poll"]

STOPPING = ErrorBody(
    code="stopping",
    message="this replica is shutting down; retry the request (another replica answers)",
    retryable=True,
)


def is_long_poll(scope: Scope) -> bool:
    """Whether the request asks to be held until something changes (``since`` given)."""
    query = scope.get("query_string", b"").decode("latin-1")
    return "since" in parse_qs(query, keep_blank_values=True)


class Draining:
    """Tracks the requests in flight so a stop can cut them on a deadline."""

    __slots__ = ("_emptied", "_requests", "_stopping")

    def __init__(self) -> None:
        self._requests: dict[anyio.CancelScope, bool] = {}
        self._stopping = False
        self._emptied: anyio.Event | None = None

    @property
    def in_flight(self) -> int:
        """Requests being answered right now."""
        return len(self._requests)

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with every HTTP request tracked (and cut when the service stops)."""

        async def tracked(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            long_poll = is_long_poll(scope)
            if long_poll and self._stopping:
                await _refuse(send)
                return
            await self._run(app, scope, receive, send, long_poll=long_poll)

        return tracked

    async def drain(self, deadline: float) -> None:
        """Cut long-polls now, let other requests run up to ``deadline`` seconds, cut the rest."""
        self._stopping = True
        self._cut(long_polls_only=True)
        if self._requests:
            self._emptied = anyio.Event()
            with anyio.move_on_after(deadline):
                await self._emptied.wait()
        self._cut(long_polls_only=False)

    def _cut(self, *, long_polls_only: bool) -> None:
        for cancel, long_poll in list(self._requests.items()):
            if long_poll or not long_polls_only:
                cancel.cancel()

    async def _run(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, *, long_poll: bool
    ) -> None:
        answered = False

        async def watched_send(message: Message) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        with anyio.CancelScope() as cancel:
            self._requests[cancel] = long_poll
            try:
                await app(scope, receive, watched_send)
            finally:
                self._forget(cancel)
        # Cut after answering began: returning makes the server close the connection, which
        # is all a client can be told mid-body.
        if cancel.cancelled_caught and not answered:
            await _refuse(send)

    def _forget(self, cancel: anyio.CancelScope) -> None:
        del self._requests[cancel]
        if not self._requests and self._emptied is not None:
            self._emptied.set()


async def _refuse(send: Send) -> None:
    body = json.dumps(STOPPING.to_dict()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"retry-after", b"0"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
