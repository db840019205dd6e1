"""Encoding responses: objects, lists, Status bodies and the streaming watch.

Lists are assembled from each entry's cached bytes (no re-encoding), which is what makes a
100,000-pod list cheap. The watch response is its own ASGI callable so that the watcher is
always unregistered: on timeout, on a cut, and when the client goes away.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from rgpu_kubesim.apiserver.endpoints import _tables
from rgpu_kubesim.apiserver.endpoints._requests import wants_table
from rgpu_kubesim.apiserver.storage import (
    INITIAL_EVENTS_END,
    ListPage,
    Storage,
    WatchStart,
    event_line,
)
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import Entry, Resource, full_bytes

JSON = "application/json"
_CHUNK_BYTES = 64 * 1024
_FINAL_SEND_SECONDS = 1.0


def json_response(body: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type=JSON)


def object_response(
    resource: Resource, entry: Entry, status_code: int = 200, warnings: Iterable[str] = ()
) -> Response:
    """The object as stored; each warning becomes a ``Warning: 299 - "..."`` header."""
    response = Response(full_bytes(resource, entry), status_code=status_code, media_type=JSON)
    for text in warnings:
        response.headers.append("Warning", "299 - " + orjson.dumps(text).decode())
    return response


def error_response(error: ApiError) -> Response:
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after else None
    return Response(
        orjson.dumps(error.status), status_code=error.code, media_type=JSON, headers=headers
    )


def list_bytes(resource: Resource, page: ListPage) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(page.rv)}
    if page.continue_token:
        meta["continue"] = page.continue_token
    if page.remaining is not None:
        meta["remainingItemCount"] = page.remaining
    head = b'{"kind":"%s","apiVersion":"%s","metadata":%s,"items":[' % (
        resource.list_kind.encode(),
        resource.api_version.encode(),
        orjson.dumps(meta),
    )
    return head + b",".join(e.body for e in page.entries) + b"]}"


def list_response(request: Request, resource: Resource, page: ListPage, now: float) -> Response:
    if wants_table(request):
        return json_response(
            _tables.table(
                resource, page.entries, rv=page.rv, now=now, continue_token=page.continue_token
            )
        )
    return Response(list_bytes(resource, page), media_type=JSON)


def bookmark_line(resource: Resource, rv: int, *, initial_end: bool = False) -> bytes:
    """A BOOKMARK event: an empty object of the kind carrying only the resourceVersion."""
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    obj: dict[str, Any] = {
        "kind": resource.kind,
        "apiVersion": resource.api_version,
        "metadata": meta,
    }
    if resource.plural == "pods":
        obj.update(spec={"containers": None}, status={})
    return event_line("BOOKMARK", orjson.dumps(obj))


def _batches(lines: Iterator[bytes]) -> Iterator[bytes]:
    batch: list[bytes] = []
    size = 0
    for line in lines:
        batch.append(line)
        size += len(line)
        if size >= _CHUNK_BYTES:
            yield b"".join(batch)
            batch, size = [], 0
    if batch:
        yield b"".join(batch)


class WatchResponse(Response):
    """A chunked stream of watch events that ends on timeout, cut, shutdown or disconnect."""

    def __init__(
        self,
        storage: Storage,
        start: WatchStart,
        *,
        timeout: float,
        bookmark_interval: float | None,
        initial_end_bookmark: bool,
    ) -> None:
        # Not Response.__init__: it would fix Content-Length to an empty body; a watch is chunked.
        self.status_code = 200
        self.media_type = JSON
        self.background = None
        self.init_headers()
        self._storage = storage
        self._start = start
        self._timeout = timeout
        self._bookmark_interval = bookmark_interval
        self._initial_end = initial_end_bookmark

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = self._start.watcher
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._until_disconnect, receive, tg.cancel_scope)
                await self._pump(send)
                tg.cancel_scope.cancel()
        finally:
            self._storage.close_watch(watcher)
        # A client that stopped reading must not hold the connection task forever.
        with anyio.move_on_after(_FINAL_SEND_SECONDS):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _until_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async def _chunk(self, send: Send, data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def _pump(self, send: Send) -> None:
        resource = self._start.watcher.resource
        deadline = anyio.current_time() + self._timeout
        for chunk in _batches(self._start.initial):
            await self._chunk(send, chunk)
        if self._initial_end:
            await self._chunk(send, bookmark_line(resource, self._start.rv, initial_end=True))
        await self._live(send, deadline)

    async def _live(self, send: Send, deadline: float) -> None:
        watcher = self._start.watcher
        interval = self._bookmark_interval
        next_bookmark = anyio.current_time() + (interval or 0)
        while not watcher.closed and anyio.current_time() < deadline:
            wake_at = min(deadline, next_bookmark) if interval else deadline
            lines = await watcher.take(wake_at - anyio.current_time())
            if lines:
                await self._chunk(send, b"".join(lines))
            elif interval and not watcher.closed and anyio.current_time() >= next_bookmark:
                # Nothing is pending and writes never await, so this version is fully delivered.
                await self._chunk(
                    send, bookmark_line(watcher.resource, self._storage.resource_version)
                )
                next_bookmark = anyio.current_time() + interval
