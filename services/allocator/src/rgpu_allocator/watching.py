"""The allocator decides from memory, so its memory must follow the
apiserver: every Pod (slimmed) and every claim Lease, by list+watch, relisting on ``410
Expired`` and backing off on errors. Each event is applied in microseconds; anything that
needs an apiserver call is handed to the reconciler instead.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts import PodUID
from rgpu_runtime import Backoff, KubeError, KubeExpired, WatchEvent

from .instruments import Instruments
from .kube_api import KubeApi
from .leases import ANNOTATION_SERVER, LeaseRecord, decode_lease
from .ledger import Ledger
from .pods import PodIndex, PodInfo, pod_info

__all__ = ["LeaseHooks", "PodHooks", "watch_leases", "watch_pods"]

logger = logging.getLogger(__name__)

BACKOFF = Backoff(initial=0.2, maximum=10.0)
"""Relist quickly after a blip; at most every 10 s while the apiserver is away."""

PodHooks = Callable[[PodInfo | None, PodInfo | None], None]
"""Called with (before, after) for every pod change; ``after`` is ``None`` when deleted."""


class LeaseHooks:
    """What the Lease watch reports: capacity freed, and pods whose claims need a look."""

    __slots__ = ("freed", "touched")

    def __init__(self, *, freed: Callable[[], None], touched: Callable[[str], None]) -> None:
        self.freed = freed
        self.touched = touched


async def _close(events: AsyncIterator[WatchEvent]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()


async def _list_watch(
    resource: str,
    relist: Callable[[], Awaitable[str]],
    watch: Callable[[str], AsyncIterator[WatchEvent]],
    handle: Callable[[WatchEvent], None],
    instruments: Instruments,
    task_status: TaskStatus[None],
) -> None:
    started = False
    failures = 0
    while True:
        try:
            version = await relist()
            if not started:
                task_status.started()
                started = True
            failures = 0
            events = watch(version)
            try:
                async for event in events:
                    handle(event)
            finally:
                await _close(events)
        except KubeExpired:
            instruments.watch_restarts.labels(resource).inc()
        except KubeError as exc:
            instruments.watch_restarts.labels(resource).inc()
            logger.warning("watching %s failed, relisting: %s", resource, exc)
            await anyio.sleep(BACKOFF.delay(failures))
            failures += 1


async def watch_pods(
    api: KubeApi,
    pods: PodIndex,
    hooks: PodHooks,
    instruments: Instruments,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Mirror every pod into ``pods``; returns from ``tg.start`` once the first list is in."""

    async def relist() -> str:
        fresh: dict[PodUID, PodInfo] = {}
        version = ""
        async for page in api.pod_pages():
            for item in page.items:
                info = pod_info(item)
                if info is not None:
                    fresh[info.uid] = info
            version = page.resource_version or version
        for before, after in pods.replace_all(fresh):
            hooks(before, after)
        return version

    def handle(event: WatchEvent) -> None:
        apply_pod_event(pods, event, hooks)

    await _list_watch("pods", relist, api.watch_pods, handle, instruments, task_status)


def apply_pod_event(pods: PodIndex, event: WatchEvent, hooks: PodHooks) -> None:
    """Apply one pod watch event to ``pods`` and report the change."""
    info = pod_info(event.object)
    if info is None:
        return
    if event.type == "DELETED":
        hooks(pods.remove(info.uid) or info, None)
    elif event.type in ("ADDED", "MODIFIED"):
        hooks(pods.put(info), info)


async def watch_leases(
    api: KubeApi,
    ledger: Ledger,
    hooks: LeaseHooks,
    instruments: Instruments,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Mirror the claim Leases into ``ledger``; returns from ``tg.start`` after the first list."""

    async def relist() -> str:
        listing = await api.list_leases()
        records = (decode_lease(item) for item in listing.items)
        first = not ledger.synced
        if ledger.replace_all(r for r in records if r is not None).freed and not first:
            hooks.freed()
        return listing.resource_version

    def handle(event: WatchEvent) -> None:
        apply_lease_event(ledger, event, hooks)

    await _list_watch("leases", relist, api.watch_leases, handle, instruments, task_status)


def _touch(record: LeaseRecord | None, hooks: LeaseHooks) -> None:
    for claim in record.claims if record is not None else ():
        hooks.touched(claim.pod.uid)


def apply_lease_event(ledger: Ledger, event: WatchEvent, hooks: LeaseHooks) -> None:
    """Apply one Lease watch event to ``ledger`` and report what it changed."""
    if event.type == "DELETED":
        server = ((event.object.get("metadata") or {}).get("annotations") or {}).get(
            ANNOTATION_SERVER
        )
        before = ledger.lease(server) if isinstance(server, str) else None
        if before is not None and ledger.forget(before.server, event.resource_version).freed:
            hooks.freed()
        # Pods that held claims here may still be running: the reconciler repairs them.
        _touch(before, hooks)
        return
    if event.type not in ("ADDED", "MODIFIED"):
        return
    record = decode_lease(event.object)
    if record is None:
        return
    change = ledger.apply(record)
    if change.freed:
        hooks.freed()
    if change.applied:
        for claim in record.claims:
            if ledger.servers_of(claim.pod.uid) > 1:
                hooks.touched(claim.pod.uid)
