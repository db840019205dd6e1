"""Why this module exists: the scheduler and kubelet emulators are *clients* of the simulated
apiserver, exactly like the real components are of kube-apiserver — they list and watch over
HTTP, never peek into the store. This is the small list+watch cache they share."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
import orjson
from anyio.abc import TaskStatus

__all__ = ["Informer", "KubeHttp"]

logger = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[None] | None]


class _Expired(Exception):
    """The watch's resourceVersion fell out of the apiserver's window: relist."""


class KubeHttp:
    """Raw JSON access to the apiserver (what a controller needs, nothing more)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def get(self, path: str, **params: str) -> dict[str, Any]:
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
        self, path: str, resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
        }
        async with self.client.stream("GET", path, params=params, timeout=None) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = orjson.loads(line)
                if event["type"] == "ERROR":
                    raise _Expired(str(event["object"].get("message", "")))
                yield event["type"], event["object"]


_JSON = {"Content-Type": "application/json"}


class Informer:
    """List then watch ``path`` forever, keeping ``objects`` by uid and calling ``handler``.

    ``handler(event_type, obj)`` sees ADDED/MODIFIED/DELETED; a relist after a cut watch or a
    410 replays the current state as ADDED and synthesises DELETED for objects that vanished.
    """

    def __init__(self, api: KubeHttp, path: str, handler: Handler) -> None:
        self.api = api
        self.path = path
        self.handler = handler
        self.objects: dict[str, dict[str, Any]] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            try:
                version = await self._relist()
                if not started:
                    started = True
                    task_status.started()
                await self._watch(version)
            except (_Expired, httpx.HTTPError, orjson.JSONDecodeError) as exc:
                logger.debug("informer %s restarts: %s", self.path, exc)
                await anyio.sleep(0.2)

    async def _relist(self) -> str:
        body = await self.api.get(self.path)
        fresh = {item["metadata"]["uid"]: item for item in body.get("items") or []}
        for uid in set(self.objects) - set(fresh):
            await self._emit("DELETED", self.objects.pop(uid))
        for uid, obj in fresh.items():
            self.objects[uid] = obj
            await self._emit("ADDED", obj)
        return str(body["metadata"]["resourceVersion"])

    async def _watch(self, version: str) -> None:
        async for kind, obj in self.api.watch(self.path, version):
            if kind == "BOOKMARK":
                continue
            uid = obj["metadata"]["uid"]
            if kind == "DELETED":
                self.objects.pop(uid, None)
            else:
                self.objects[uid] = obj
            await self._emit(kind, obj)

    async def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        result = self.handler(kind, obj)
        if result is not None:
            await result
