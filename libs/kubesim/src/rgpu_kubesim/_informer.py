"""The scheduler and kubelet emulators are *clients* of the simulated
apiserver, exactly like the real components are of kube-apiserver — they list and watch over
HTTP, never peek into the store. This is the small list+watch cache they share, with client-go's
reflector rules: resume a watch from the last resourceVersion seen, relist only when the
apiserver says that version expired, and back off (never spin) while the apiserver fails.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson
from anyio.abc import TaskStatus

__all__ = ["ADDED", "DELETED", "MODIFIED", "Handler", "Informer", "InformerTiming", "KubeHttp"]

logger = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"

Handler = Callable[[str, dict[str, Any], dict[str, Any] | None], None]
"""``handler(event, obj, old)``: ``old`` is the cached state a MODIFIED replaces, else ``None``;
for DELETED ``obj`` is the last state known."""

_JSON = {"Content-Type": "application/json"}


class _Expired(Exception):
    """The watch's resourceVersion fell out of the apiserver's window: relist."""


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

    async def watch(
        self, path: str, resource_version: str, **params: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Yield ``(type, object)`` until the stream ends; raises ``_Expired`` on an ERROR event."""
        query = {
            **params,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
        }
        async with self.client.stream("GET", path, params=query, timeout=None) as response:
            if response.status_code == 410:
                raise _Expired("410 Gone")
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.strip():
                    yield _event(orjson.loads(line))


def _event(event: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if event["type"] == "ERROR":
        status = event.get("object") or {}
        raise _Expired(f"{status.get('code')} {status.get('message', '')}")
    return str(event["type"]), event["object"]


@dataclass(frozen=True, slots=True, kw_only=True)
class InformerTiming:
    """How long to wait after a failed list or watch; doubles per failure, resets on progress."""

    initial_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 5.0


def _uid(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


def _version(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


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
        self.objects: dict[str, dict[str, Any]] = {}
        self._params = {"fieldSelector": field_selector} if field_selector else {}
        self._timing = timing or InformerTiming()
        self._delay = self._timing.initial_backoff_seconds
        self._version = ""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve forever; reports started once the first list is in the cache."""
        await self._list_until_done()
        task_status.started()
        while True:
            try:
                progressed = await self._watch()
            except _Expired as exc:
                logger.info("informer %s relists: %s", self.path, exc)
                await self._list_until_done()
                continue
            except (httpx.HTTPError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
                logger.warning("informer %s watch failed: %r", self.path, exc)
                progressed = False
            if not progressed:
                await self._pause()

    async def _list_until_done(self) -> None:
        while True:
            try:
                await self._relist()
                return
            except (httpx.HTTPError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
                logger.warning("informer %s list failed: %r", self.path, exc)
                await self._pause()

    async def _pause(self) -> None:
        await anyio.sleep(self._delay)
        self._delay = min(self._delay * 2, self._timing.max_backoff_seconds)

    async def _relist(self) -> None:
        body = await self.api.get(self.path, **self._params)
        fresh = {_uid(item): item for item in body.get("items") or []}
        version = str(body["metadata"]["resourceVersion"])
        for uid in [u for u in self.objects if u not in fresh]:
            self.handler(DELETED, self.objects.pop(uid), None)
        for uid, obj in fresh.items():
            self._apply(uid, obj)
        self._version = version
        self._delay = self._timing.initial_backoff_seconds

    def _apply(self, uid: str, obj: dict[str, Any]) -> None:
        old = self.objects.get(uid)
        if old is not None and _version(old) == _version(obj):
            return
        self.objects[uid] = obj
        self.handler(ADDED if old is None else MODIFIED, obj, old)

    async def _watch(self) -> bool:
        """Watch from the last version; True when anything (a bookmark too) arrived."""
        progressed = False
        async for kind, obj in self.api.watch(self.path, self._version, **self._params):
            progressed = True
            self._delay = self._timing.initial_backoff_seconds
            self._version = _version(obj) or self._version
            if kind == DELETED:
                if self.objects.pop(_uid(obj), None) is not None:
                    self.handler(DELETED, obj, None)
            elif kind in (ADDED, MODIFIED):
                self._apply(_uid(obj), obj)
        return progressed
