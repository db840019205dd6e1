"""Every rgpu cache of apiserver objects (Pods, claim Leases, Nodes) follows the apiserver the
same way, with client-go's reflector rules, so the rules live here once.

List (page by page), then watch from the list's resourceVersion with bookmarks. A stream that
ends or drops resumes from the last resourceVersion seen, bookmarks included. ``410 Expired``
means the history is gone: relist, and reconcile the fresh list against the cache, so a
consumer sees the adds, updates and deletes it missed instead of a reset. Other failures back
off (capped, jittered). A watch that stays silent (not even a bookmark) for longer than
``stall_seconds`` is presumed dead and reopened (docs/design.md#stale-caches-are-noticed), and
``age()`` tells callers how old the cache's news is, so they can refuse to judge on it.

Values are what ``transform`` makes of each object: a consumer that keeps slim records (the
allocator's pods) never holds the full dicts twice.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import anyio
from anyio.abc import TaskStatus

from rgpu_runtime.errors import KubeError, KubeExpired
from rgpu_runtime.pacing import Backoff

from ._client import ApiCall, KubeClient, Listing
from ._watch import WatchEvent

__all__ = [
    "ObjectChange",
    "Reflector",
    "ReflectorTiming",
    "WatchTrouble",
    "kube_pages",
    "object_key",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

ListPages = Callable[[], AsyncIterator[Listing]]
"""Lists every object, one page at a time; the last page carries the list's resourceVersion."""
OpenWatch = Callable[[str], AsyncIterator[WatchEvent]]
"""Watches from a resourceVersion (bookmarks allowed); raises ``KubeExpired`` on 410."""


WATCH_BACKOFF = Backoff(initial=0.2, maximum=10.0)
"""Relist quickly after a blip; at most every 10 s while the apiserver is away."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReflectorTiming:
    """How a reflector waits and when it gives up on a silent watch."""

    backoff: Backoff = WATCH_BACKOFF
    """Waits after failures."""
    stall_seconds: float = 120.0
    """A watch silent this long is reopened. kube-apiserver bookmarks about once a minute, so
    two missed bookmarks mean the connection is dead even if TCP has not noticed."""
    stall_check_seconds: float = 1.0
    """How often the watchdog looks; the stall limit is honoured to within this."""

    def __post_init__(self) -> None:
        if self.stall_seconds <= 0 or self.stall_check_seconds <= 0:
            raise ValueError(f"ReflectorTiming needs positive stall times, got {self}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectChange(Generic[T]):
    """One object's change: ``before`` is ``None`` when ADDED, ``after`` when DELETED."""

    type: str
    before: T | None
    after: T | None
    resource_version: str


OnRelist = Callable[[Sequence[ObjectChange[T]], Mapping[str, T]], None]
"""Receives a relist's changes (the diff against the cache) and the complete new values."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchTrouble:
    """Why the reflector restarted: ``reason`` is expired, error or stalled; ``phase`` list or
    watch; ``error`` the apiserver's error, if any."""

    reason: str
    phase: str
    error: KubeError | None = None


def object_key(obj: Mapping[str, Any]) -> str:
    """The object's uid, or ``namespace/name`` when it has none."""
    metadata = obj.get("metadata") or {}
    uid = metadata.get("uid")
    if uid:
        return str(uid)
    return f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}"


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


async def kube_pages(
    kube: KubeClient, fn: ApiCall, *args: Any, page_size: int = 500, **kwargs: Any
) -> AsyncIterator[Listing]:
    """List with ``fn`` (a kubernetes_asyncio list method) in pages of ``page_size``.

    Each page is a ``Listing``; only the last one carries the list's resourceVersion. Raises
    ``KubeExpired`` when a continue token expired mid-list.
    """
    token: str | None = None
    while True:
        page = await kube.call_raw(fn, *args, limit=page_size, _continue=token, **kwargs)
        metadata = page.get("metadata") or {}
        token = metadata.get("continue") or None
        version = "" if token else str(metadata.get("resourceVersion") or "")
        yield Listing(resource_version=version, items=tuple(page.get("items") or ()))
        if token is None:
            return


async def _close(events: AsyncIterator[WatchEvent]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()


class Reflector(Generic[T]):
    """Keeps ``values`` (key -> ``transform(object)``) in step with the apiserver.

    ``on_change`` hears every change, ``on_trouble`` every restart. A consumer whose store
    swaps in a whole list at once (one publication instead of one per object) passes
    ``on_relist``, which then receives each relist's changes together with the new values.
    ``run`` reports started once the first list is in.
    """

    def __init__(
        self,
        *,
        name: str,
        list_pages: ListPages,
        watch: OpenWatch,
        transform: Callable[[dict[str, Any]], T | None],
        on_change: Callable[[ObjectChange[T]], None],
        on_trouble: Callable[[WatchTrouble], None] | None = None,
        on_relist: OnRelist[T] | None = None,
        key: Callable[[Mapping[str, Any]], str] = object_key,
        timing: ReflectorTiming | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._list_pages = list_pages
        self._watch = watch
        self._transform = transform
        self._on_change = on_change
        self._on_trouble = on_trouble
        self._on_relist = on_relist
        self._key = key
        self._timing = timing or ReflectorTiming()
        self._clock = clock
        self._values: dict[str, T] = {}
        self._versions: dict[str, str] = {}
        self._watch_scope: anyio.CancelScope | None = None
        self._watch_opened = 0.0
        self._failures = 0
        self.resource_version = ""
        """The last resourceVersion seen (list, event or bookmark); empty means relist."""
        self.synced = False
        """Whether a complete list has been loaded (before that, absence means nothing)."""
        self.heard_at: float | None = None
        """``clock()`` when the apiserver last told us something (list, event or bookmark)."""

    @property
    def values(self) -> Mapping[str, T]:
        """The cache: key -> value, a read-only live view."""
        return MappingProxyType(self._values)

    def age(self) -> float:
        """Seconds since the apiserver last told us anything; infinite before the first list."""
        return math.inf if self.heard_at is None else self._clock() - self.heard_at

    def fresh(self, within: float) -> bool:
        """Whether the cache heard from the apiserver in the last ``within`` seconds."""
        return self.age() <= within

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the apiserver until cancelled; started once the first list is in."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watchdog)
            await self._follow(task_status)

    async def _follow(self, task_status: TaskStatus[None]) -> None:
        while True:
            phase = "list"
            try:
                if not self.resource_version:
                    first = not self.synced
                    await self._relist()
                    if first:
                        task_status.started()
                phase = "watch"
                await self._stream()
            except KubeExpired as exc:
                self.resource_version = ""
                self._trouble(WatchTrouble(reason="expired", phase=phase, error=exc))
                if phase == "list":
                    # A continue token expired mid-list: list again, but never in a tight loop.
                    await self._back_off()
            except KubeError as exc:
                self._trouble(WatchTrouble(reason="error", phase=phase, error=exc))
                await self._back_off()

    async def _back_off(self) -> None:
        await anyio.sleep(self._timing.backoff.delay(self._failures))
        self._failures += 1

    async def _relist(self) -> None:
        values: dict[str, T] = {}
        versions: dict[str, str] = {}
        version = ""
        async for page in self._list_pages():
            for item in page.items:
                value = self._transform(item)
                if value is not None:
                    key = self._key(item)
                    values[key], versions[key] = value, _version(item)
            version = page.resource_version or version
        # Set first, so a consumer's ``on_relist`` reads the position its new values are at.
        self.resource_version = version
        self._reconcile(values, versions)
        self.synced = True
        self._failures = 0
        self._heard()

    def _reconcile(self, values: dict[str, T], versions: dict[str, str]) -> None:
        old, old_versions = self._values, self._versions
        self._values, self._versions = values, versions
        changes = [
            ObjectChange(
                type="DELETED", before=value, after=None, resource_version=old_versions[key]
            )
            for key, value in old.items()
            if key not in values
        ]
        for key, value in values.items():
            version = versions[key]
            before = old.get(key)
            if before is None or old_versions[key] != version:
                kind = "ADDED" if before is None else "MODIFIED"
                changes.append(
                    ObjectChange(type=kind, before=before, after=value, resource_version=version)
                )
        if self._on_relist is not None:
            self._on_relist(changes, self.values)
            return
        for change in changes:
            self._on_change(change)

    def _emit(self, kind: str, before: T | None, after: T | None, version: str) -> None:
        change = ObjectChange(type=kind, before=before, after=after, resource_version=version)
        self._on_change(change)

    async def _stream(self) -> None:
        """Watch until the stream fails (raises) or stalls (returns, to reopen it)."""
        events = self._watch(self.resource_version)
        heard = False
        with anyio.CancelScope() as scope:
            self._watch_scope = scope
            self._watch_opened = self._clock()
            try:
                async for event in events:
                    heard = True
                    self._failures = 0
                    self._heard()
                    self.apply(event)
            finally:
                self._watch_scope = None
                with anyio.CancelScope(shield=True):
                    await _close(events)
        if scope.cancelled_caught:
            logger.info(
                "watching %s: silent for %.0f s, reopening", self.name, self._timing.stall_seconds
            )
            self._trouble(WatchTrouble(reason="stalled", phase="watch"))
        elif not heard:
            # A stream that ends empty is no progress: wait, so a failing server is not hammered.
            await self._back_off()

    def apply(self, event: WatchEvent) -> None:
        """Apply one watch event to the cache and report what it changed."""
        version = event.resource_version
        self.resource_version = version or self.resource_version
        if event.type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        key = self._key(event.object)
        before = self._values.get(key)
        value = None if event.type == "DELETED" else self._transform(event.object)
        if value is None:
            # Deleted, or no longer of interest to this cache (a relabel, a filter): gone.
            if before is not None:
                del self._values[key], self._versions[key]
                self._emit("DELETED", before, None, version)
            return
        if before is not None and self._versions[key] == version:
            return
        self._values[key], self._versions[key] = value, version
        self._emit("ADDED" if before is None else "MODIFIED", before, value, version)

    async def _watchdog(self) -> None:
        while True:
            await anyio.sleep(self._timing.stall_check_seconds)
            scope = self._watch_scope
            if scope is not None and self._silent() > self._timing.stall_seconds:
                scope.cancel()

    def _silent(self) -> float:
        last = max(self.heard_at or 0.0, self._watch_opened)
        return self._clock() - last

    def _heard(self) -> None:
        self.heard_at = self._clock()

    def _trouble(self, trouble: WatchTrouble) -> None:
        if trouble.error is not None:
            level = logging.INFO if trouble.reason == "expired" else logging.WARNING
            logger.log(
                level,
                "watching %s: the %s failed, %s: %s",
                self.name,
                trouble.phase,
                "relisting" if trouble.reason == "expired" else "retrying",
                trouble.error,
            )
        if self._on_trouble is not None:
            self._on_trouble(trouble)
