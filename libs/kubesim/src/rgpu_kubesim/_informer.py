"""The scheduler and kubelet emulators are *clients* of the simulated
apiserver, exactly like the real components are of kube-apiserver — they list and watch over
HTTP, never peek into the store. They follow it with the same reflector as the rgpu services
(``rgpu_runtime.kube.Reflector``: resume from the last resourceVersion, relist by diff only when
that version expired, back off while the apiserver fails); this module is their HTTP client
(aiohttp: the emulators send several requests per scheduled pod, and httpx's own layers cost
about as much CPU again as the apiserver answering them) and the ``handler(event, obj, old)``
shape the emulators use.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
import anyio
import httpx
import orjson
from anyio.abc import TaskStatus

from rgpu_runtime.errors import KubeExpired, KubeUnavailable
from rgpu_runtime.kube import Listing, ObjectChange, Reflector, ReflectorTiming, WatchEvent
from rgpu_runtime.pacing import Backoff

__all__ = [
    "ADDED",
    "DELETED",
    "MODIFIED",
    "Handler",
    "Informer",
    "InformerTiming",
    "KubeHttp",
    "KubeHttpError",
    "Reply",
    "close_session",
]

logger = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"

Handler = Callable[[str, dict[str, Any], dict[str, Any] | None], None]
"""``handler(event, obj, old)``: ``old`` is the cached state a MODIFIED replaces, else ``None``;
for DELETED ``obj`` is the last state known."""

TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
"""What a request to the apiserver raises when no answer came (a kubelet retries these)."""
_JSON = "application/json"
_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10.0)
_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10.0)


class KubeHttpError(Exception):
    """The apiserver answered a list or a watch with an error status."""


_BROKEN = (*TRANSPORT_ERRORS, KubeHttpError, orjson.JSONDecodeError, KeyError, TypeError)


@dataclass(frozen=True, slots=True)
class Reply:
    """An apiserver answer: status and body."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return orjson.loads(self.body)


async def close_session(session: aiohttp.ClientSession) -> None:
    """Close ``session`` even while the caller is being cancelled (an emulator stops by
    cancellation), so no connection is left open and no unclosed-session warning follows."""
    with anyio.CancelScope(shield=True):
        await session.close()


def base_url_of(apiserver: str | httpx.AsyncClient) -> str:
    """The apiserver's base URL; of a client, its ``base_url`` (nothing else of it is used)."""
    url = apiserver if isinstance(apiserver, str) else str(apiserver.base_url)
    return url.rstrip("/")


class KubeHttp:
    """Raw JSON access to the apiserver (what a controller needs, nothing more).

    ``async with`` it around its use: it owns one aiohttp session (kept-alive connections)
    that announces ``user_agent``, as kube's components announce themselves.
    """

    def __init__(self, base_url: str, *, user_agent: str) -> None:
        self.base_url = base_url
        self.user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeHttp:
        headers = {"User-Agent": self.user_agent, "Accept": _JSON}
        self._session = aiohttp.ClientSession(headers=headers, trust_env=False)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        session, self._session = self._session, None
        if session is not None:
            await close_session(session)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("KubeHttp is used outside its `async with` block")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        body: object = None,
        content_type: str = _JSON,
        params: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send one request; raises only ``TRANSPORT_ERRORS`` (no answer)."""
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else None
        async with self._open().request(
            method,
            self.base_url + path,
            data=data,
            headers=headers,
            params=params,
            timeout=_REQUEST_TIMEOUT,
        ) as response:
            return Reply(response.status, await response.read())

    async def get(self, path: str, **params: str) -> dict[str, Any]:
        """GET a JSON object; raises ``KubeHttpError`` for any non-2xx answer."""
        reply = await self.request("GET", path, params=params or None)
        if not 200 <= reply.status < 300:
            raise KubeHttpError(f"GET {path}: HTTP {reply.status} {reply.text[:200]}")
        body: dict[str, Any] = reply.json()
        return body

    async def post(self, path: str, body: object) -> Reply:
        return await self.request("POST", path, body)

    async def patch(self, path: str, body: object, kind: str = "merge") -> Reply:
        return await self.request("PATCH", path, body, f"application/{kind}-patch+json")

    async def pages(self, path: str, **params: str) -> AsyncIterator[Listing]:
        """The whole list as one page; any failure becomes ``KubeUnavailable``."""
        try:
            body = await self.get(path, **params)
            version = str(body["metadata"]["resourceVersion"])
        except _BROKEN as exc:
            raise KubeUnavailable(f"list {path} failed: {exc!r}") from exc
        yield Listing(resource_version=version, items=tuple(body.get("items") or ()))

    async def watch(
        self, path: str, resource_version: str, **params: str
    ) -> AsyncIterator[WatchEvent]:
        """Yield events until the stream ends; ``KubeExpired`` on an ERROR event or a 410,
        ``KubeUnavailable`` for any other failure."""
        query = {
            **params,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
        }
        try:
            async with self._open().get(
                self.base_url + path, params=query, timeout=_STREAM_TIMEOUT
            ) as response:
                if response.status == 410:
                    raise KubeExpired(f"watch {path}: 410 Gone")
                if response.status != 200:
                    raise KubeHttpError(f"watch {path}: HTTP {response.status}")
                async for line in _lines(response.content):
                    yield _event(orjson.loads(line))
        except _BROKEN as exc:
            raise KubeUnavailable(f"watch {path} failed: {exc!r}") from exc


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The stream's non-empty lines, however long (aiohttp's own reader caps a line at
    128 KiB, below what one object may weigh)."""
    pending = b""
    async for chunk in stream.iter_any():
        pending += chunk
        if b"\n" not in chunk:
            continue
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _event(event: dict[str, Any]) -> WatchEvent:
    if event["type"] == "ERROR":
        status = event.get("object") or {}
        raise KubeExpired(f"{status.get('code')} {status.get('message', '')}")
    return WatchEvent(type=str(event["type"]), object=event["object"])


@dataclass(frozen=True, slots=True, kw_only=True)
class InformerTiming:
    """How long to wait after a failed list or watch; doubles per failure, resets on progress."""

    initial_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 5.0

    def reflector(self) -> ReflectorTiming:
        # No jitter: one emulator per cluster has nobody to spread its retries from.
        backoff = Backoff(
            initial=self.initial_backoff_seconds, maximum=self.max_backoff_seconds, jitter=0.0
        )
        return ReflectorTiming(backoff=backoff)


def _same(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


class Informer:
    """List then watch ``path`` forever, keeping ``objects`` by uid and calling ``handler``.

    A relist (first start, or after 410 Expired) is reconciled against the cache: new objects are
    ADDED, changed ones MODIFIED, vanished ones DELETED, unchanged ones produce nothing — so a
    consumer sees every object once per change, however often the watch is cut.
    """

    def __init__(
        self,
        api: KubeHttp,
        path: str,
        handler: Handler,
        *,
        field_selector: str = "",
        timing: InformerTiming | None = None,
    ) -> None:
        self.api = api
        self.path = path
        self.handler = handler
        params = {"fieldSelector": field_selector} if field_selector else {}
        self._reflector = Reflector[dict[str, Any]](
            name=path,
            list_pages=lambda: api.pages(path, **params),
            watch=lambda version: api.watch(path, version, **params),
            transform=_same,
            on_change=self._changed,
            timing=(timing or InformerTiming()).reflector(),
        )

    @property
    def objects(self) -> Mapping[str, dict[str, Any]]:
        """The cache by uid (read-only)."""
        return self._reflector.values

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve forever; reports started once the first list is in the cache."""
        await self._reflector.run(task_status=task_status)

    def _changed(self, change: ObjectChange[dict[str, Any]]) -> None:
        if change.after is None:
            if change.before is not None:
                self.handler(DELETED, change.before, None)
            return
        self.handler(change.type, change.after, change.before)
