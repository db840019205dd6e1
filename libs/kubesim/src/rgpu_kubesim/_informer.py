"""The scheduler and kubelet emulators are *clients* of the simulated
apiserver, exactly like the real components are of kube-apiserver — they list and watch over
HTTP, never peek into the store. They follow it with the same reflector as the rgpu services
(``rgpu_runtime.Reflector``: resume from the last resourceVersion, relist by diff only when
that version expired, back off while the apiserver fails); this module is its plain-httpx
transport and the ``handler(event, obj, old)`` shape the emulators use.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson
from anyio.abc import TaskStatus

from rgpu_runtime import (
    Backoff,
    KubeExpired,
    KubeUnavailable,
    Listing,
    ObjectChange,
    Reflector,
    ReflectorTiming,
    WatchEvent,
)

__all__ = ["ADDED", "DELETED", "MODIFIED", "Handler", "Informer", "InformerTiming", "KubeHttp"]

logger = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"

Handler = Callable[[str, dict[str, Any], dict[str, Any] | None], None]
"""``handler(event, obj, old)``: ``old`` is the cached state a MODIFIED replaces, else ``None``;
for DELETED ``obj`` is the last state known."""

_JSON = {"Content-Type": "application/json"}
_BROKEN = (httpx.HTTPError, orjson.JSONDecodeError, KeyError, TypeError)


class KubeHttp:
    """Raw JSON access to the apiserver (what a controller needs, nothing more)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def get(self, path: str, **params: str) -> dict[str, Any]:
        """GET a JSON object; raises ``httpx.HTTPStatusError`` for any non-2xx answer."""
        response = await self.client.get(path, params=params)
        response.raise_for_status()
        body: dict[str, Any] = orjson.loads(response.content)
        return body

    async def post(self, path: str, body: object) -> httpx.Response:
        return await self.client.post(path, content=orjson.dumps(body), headers=_JSON)

    async def patch(self, path: str, body: object, kind: str = "merge") -> httpx.Response:
        headers = {"Content-Type": f"application/{kind}-patch+json"}
        return await self.client.patch(path, content=orjson.dumps(body), headers=headers)

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
            async with self.client.stream("GET", path, params=query, timeout=None) as response:
                if response.status_code == 410:
                    raise KubeExpired(f"watch {path}: 410 Gone")
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if line.strip():
                        yield _event(orjson.loads(line))
        except _BROKEN as exc:
            raise KubeUnavailable(f"watch {path} failed: {exc!r}") from exc


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
