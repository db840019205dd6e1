"""The allocator decides from memory, so its memory must follow the
apiserver: every Pod (slimmed) and every claim Lease. The runtime's ``Reflector`` does the
list+watch (bookmarks, relist by diff on ``410 Expired``, backoff, stalled watches reopened);
this module turns its changes into the pod index and the ledger. Each change is applied in
microseconds; anything that needs an apiserver call is handed to the reconciler instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from rgpu_runtime.kube import ObjectChange, Reflector, ReflectorTiming, WatchTrouble
from rgpu_runtime.settings import ResourceSettings

from .claims import LeaseRecord, decode_lease
from .clients import KubeApi
from .instruments import Instruments
from .ledger import Ledger
from .pods import DEFAULT_RESOURCES, PodIndex, PodInfo, pod_info
from .published import PublishedClaims

__all__ = [
    "LeaseHooks",
    "PodHooks",
    "cache_trust",
    "lease_reflector",
    "pod_changed",
    "pod_reflector",
    "watch_timing",
]

PodHooks = Callable[[PodInfo | None, PodInfo | None], None]
"""Called with (before, after) for every pod change; ``after`` is ``None`` when deleted."""


class LeaseHooks:
    """What the Lease watch reports: capacity freed, and pods whose claims need a look."""

    __slots__ = ("freed", "touched")

    def __init__(self, *, freed: Callable[[], None], touched: Callable[[str], None]) -> None:
        self.freed = freed
        self.touched = touched


def watch_timing(ttl: float) -> ReflectorTiming:
    """Watches silent for half the booking TTL are reopened (docs/design.md §10), so no claim is
    judged on a cache that missed a whole TTL of news."""
    return ReflectorTiming(stall_seconds=max(ttl / 2, 1.0))


def cache_trust(ttl: float) -> float:
    """Seconds a cache may go without news from the apiserver and still be judged on: past
    the stall limit plus one watchdog look, its watch is known dead and claims are not
    dropped on it (docs/design.md §10); decisions then read fresh or wait."""
    timing = watch_timing(ttl)
    return timing.stall_seconds + timing.stall_check_seconds


def _restarts(resource: str, instruments: Instruments) -> Callable[[WatchTrouble], None]:
    def restarted(trouble: WatchTrouble) -> None:
        instruments.watch_restarts.labels(resource).inc()

    return restarted


def pod_reflector(
    api: KubeApi,
    pods: PodIndex,
    hooks: PodHooks,
    instruments: Instruments,
    *,
    timing: ReflectorTiming | None = None,
    resources: ResourceSettings = DEFAULT_RESOURCES,
) -> Reflector[PodInfo]:
    """The reflector mirroring every pod into ``pods``; its ``run`` reports started once the
    first list is in, its ``fresh()`` says whether the mirror can be judged on. ``resources``
    names what gated pods ask for."""

    def transform(raw: Mapping[str, object]) -> PodInfo | None:
        return pod_info(raw, resources)

    def relisted(changes: Sequence[ObjectChange[PodInfo]], fresh: Mapping[str, PodInfo]) -> None:
        # The index swaps the list in (and remembers deleted uids) in one step.
        for before, after in pods.replace_all({info.uid: info for info in fresh.values()}):
            hooks(before, after)

    return Reflector[PodInfo](
        name="pods",
        list_pages=api.pod_pages,
        watch=api.watch_pods,
        transform=transform,
        on_change=pod_changed(pods, hooks),
        on_relist=relisted,
        on_trouble=_restarts("pods", instruments),
        timing=timing,
    )


def pod_changed(pods: PodIndex, hooks: PodHooks) -> Callable[[ObjectChange[PodInfo]], None]:
    """The handler applying one watched pod change to ``pods`` and reporting it."""

    def changed(change: ObjectChange[PodInfo]) -> None:
        if change.after is not None:
            hooks(pods.put(change.after), change.after)
        elif change.before is not None:
            hooks(pods.remove(change.before.uid) or change.before, None)

    return changed


def lease_reflector(
    api: KubeApi,
    ledger: Ledger,
    hooks: LeaseHooks,
    instruments: Instruments,
    *,
    timing: ReflectorTiming | None = None,
    published: PublishedClaims | None = None,
) -> Reflector[LeaseRecord]:
    """The reflector mirroring the claim Leases into ``ledger`` (and into ``published``,
    the claim set followers read, at the watch's resourceVersion)."""

    def relisted(
        changes: Sequence[ObjectChange[LeaseRecord]], fresh: Mapping[str, LeaseRecord]
    ) -> None:
        first = not ledger.synced
        if ledger.replace_all(fresh.values()).freed and not first:
            hooks.freed()
        if published is not None:
            published.relisted(fresh, reflector.resource_version)

    def changed(change: ObjectChange[LeaseRecord]) -> None:
        apply_lease_change(ledger, change, hooks)
        if published is not None:
            published.changed(change)

    reflector = Reflector[LeaseRecord](
        name="leases",
        list_pages=api.lease_pages,
        watch=api.watch_leases,
        transform=decode_lease,
        on_change=changed,
        on_relist=relisted,
        on_trouble=_restarts("leases", instruments),
        timing=timing,
    )
    return reflector


def _touch(record: LeaseRecord | None, hooks: LeaseHooks) -> None:
    for claim in record.claims if record is not None else ():
        hooks.touched(claim.pod.uid)


def apply_lease_change(
    ledger: Ledger, change: ObjectChange[LeaseRecord], hooks: LeaseHooks
) -> None:
    """Apply one watched Lease change to ``ledger`` and report what it changed."""
    record = change.after
    if record is None:
        cached = change.before
        # The ledger's copy may be newer than the watch's (our own writes land there first).
        before = None if cached is None else ledger.lease(cached.server) or cached
        if before is not None and ledger.forget(before.server, change.resource_version).freed:
            hooks.freed()
        # Pods that held claims here may still be running: the reconciler repairs them.
        _touch(before, hooks)
        return
    applied = ledger.apply(record)
    if applied.freed:
        hooks.freed()
    if applied.applied:
        for claim in record.claims:
            if ledger.servers_of(claim.pod.uid) > 1:
                hooks.touched(claim.pod.uid)
