"""What a cluster's clients cost the apiserver is the first thing a capacity plan needs, and
kube-apiserver answers it with ``apiserver_request_total`` and ``apiserver_response_sizes`` by
verb and resource. The simulator keeps the same tally, by client as well (the first word of the
User-Agent), so a benchmark can say how many requests and bytes each scheduled pod cost and
compare a watch with a periodic relist. Watch streams count their bytes as they are sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import parse_target, verb_for

__all__ = ["RequestCount", "RequestKey", "RequestMeter", "RequestMetering"]

_WATCH_FLAGS = frozenset({b"watch=true", b"watch=1"})


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestKey:
    """Who asked what: client (User-Agent's first word), kube verb, resource (``pods/binding``)."""

    client: str
    verb: str
    resource: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestCount:
    """Requests received and response body bytes sent for one key."""

    requests: int = 0
    bytes: int = 0


class RequestMeter:
    """Running totals of resource requests; ``snapshot()`` and subtract to measure a window."""

    def __init__(self) -> None:
        self._requests: dict[RequestKey, int] = {}
        self._bytes: dict[RequestKey, int] = {}

    def request(self, key: RequestKey) -> None:
        self._requests[key] = self._requests.get(key, 0) + 1

    def sent(self, key: RequestKey, size: int) -> None:
        self._bytes[key] = self._bytes.get(key, 0) + size

    def snapshot(self) -> Mapping[RequestKey, RequestCount]:
        """The totals so far, a copy."""
        return {
            key: RequestCount(requests=count, bytes=self._bytes.get(key, 0))
            for key, count in self._requests.items()
        }


def _client(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"user-agent":
            return value.decode("latin-1").split("/", 1)[0].split(" ", 1)[0] or "unknown"
    return "unknown"


def _key(scope: Scope) -> RequestKey | None:
    try:
        target = parse_target(scope["path"])
        pairs = scope.get("query_string", b"").lower().split(b"&")
        watch = not _WATCH_FLAGS.isdisjoint(pairs)
        verb = verb_for(scope["method"], target, watch)
    except ApiError:
        return None  # discovery, health, unknown paths: not resource requests
    return RequestKey(client=_client(scope), verb=verb, resource=target.fault_key)


class RequestMetering:
    """ASGI middleware feeding a ``RequestMeter``; outermost, so refusals count too."""

    def __init__(self, app: ASGIApp, *, meter: RequestMeter) -> None:
        self.app = app
        self.meter = meter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = _key(scope) if scope["type"] == "http" else None
        if key is None:
            await self.app(scope, receive, send)
            return
        self.meter.request(key)

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.body":
                self.meter.sent(key, len(message.get("body", b"")))
            await send(message)

        await self.app(scope, receive, counting)
