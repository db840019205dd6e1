"""List+watch is how every rgpu state follows the apiserver.

``watch_events`` reads a Kubernetes watch stream line by line and decodes each event with
orjson into a ``WatchEvent`` holding the object as a plain dict (building kubernetes_asyncio
models costs far more than the decode; see bench/). It keeps the last resourceVersion seen,
bookmarks included, and reopens the stream from there when the server ends it (every
``timeoutSeconds``) or the connection drops, so callers see one endless stream. An ``ERROR``
event becomes the matching ``KubeError``: ``KubeExpired`` for 410, after which the caller
relists.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import orjson

from rgpu_runtime.errors import KubeUnavailable
from rgpu_runtime.pacing import Backoff

from ._failures import status_error

__all__ = ["WatchEvent", "decode_event"]

OpenStream = Callable[[str], Awaitable[aiohttp.ClientResponse]]

QUICK_END_SECONDS = 1.0
"""A stream that ends empty sooner than this is treated as a failure and retried with backoff,
so a misbehaving server is not hammered with reconnects."""

_DROPPED = (aiohttp.ClientError, TimeoutError, OSError)


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchEvent:
    """One watch event: ``type`` is ADDED, MODIFIED, DELETED or BOOKMARK; ``object`` a dict."""

    type: str
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        """The object's ``metadata.resourceVersion`` (a bookmark carries only this)."""
        metadata = self.object.get("metadata")
        return str(metadata.get("resourceVersion") or "") if isinstance(metadata, dict) else ""


async def watch_events(
    open_stream: OpenStream, *, op: str, resource_version: str, backoff: Backoff
) -> AsyncIterator[WatchEvent]:
    """Yield events from ``resource_version`` on, reopening streams as they end."""
    version = resource_version
    quick_ends = 0
    while True:
        opened = time.monotonic()
        seen = 0
        response = await open_stream(version)
        try:
            async for event in _events(response, op):
                seen += 1
                version = event.resource_version or version
                yield event
        finally:
            # A half-read stream cannot go back to the pool; drop the connection.
            response.close()
        if seen or time.monotonic() - opened >= QUICK_END_SECONDS:
            quick_ends = 0
            continue
        await anyio.sleep(backoff.delay(quick_ends))
        quick_ends += 1


async def _events(response: aiohttp.ClientResponse, op: str) -> AsyncIterator[WatchEvent]:
    while True:
        try:
            line = await response.content.readline()
        except _DROPPED:
            return
        if not line:
            return
        if line.strip():
            yield decode_event(line, op)


def decode_event(line: bytes, op: str) -> WatchEvent:
    """Decode one watch line; raises the matching ``KubeError`` for an ``ERROR`` event."""
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise KubeUnavailable(f"{op}: the watch stream sent a line that is not JSON") from exc
    kind = raw.get("type") if isinstance(raw, dict) else None
    obj = raw.get("object") if isinstance(raw, dict) else None
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise KubeUnavailable(f"{op}: the watch stream sent an event without type or object")
    if kind == "ERROR":
        code = obj.get("code")
        raise status_error(op, code if isinstance(code, int) else 500, obj)
    return WatchEvent(type=kind, object=obj)
