"""Claim validity, repair and wake-up all ask "what is this pod doing
now?", and the allocator watches every pod in the cluster to answer without a round trip.

At 100,000 pods memory matters more than convenience, so a pod is kept as a slotted record
of the handful of fields allocation needs; repeated strings (namespaces, node names, phases,
scheduler names) are interned so thousands of pods share one copy.
"""

from __future__ import annotations

import socket
import sys
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import cast

from rgpu_contracts import ANNOTATION_ALLOCATED, READINESS_GATE, PodRef, PodUID
from rgpu_runtime.settings import ResourceSettings

from .gated import Gated, read_gated

__all__ = ["DEFAULT_GRACE", "FINISHED_PHASES", "TOMBSTONES", "PodIndex", "PodInfo", "pod_info"]

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})

DEFAULT_GRACE = 30.0
"""Kubernetes' default ``terminationGracePeriodSeconds``."""

DEFAULT_RESOURCES = ResourceSettings()

TOMBSTONES = 50_000
"""Deleted pod uids remembered: enough for any burst of deletions between two sweeps, at
about 100 bytes each."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodInfo:
    """What allocation needs to know about one pod, and nothing more."""

    uid: PodUID
    namespace: str
    name: str
    node_name: str | None
    phase: str
    scheduler_name: str
    has_allocated: bool
    """Whether the pod carries ``hami.io/remote-gpu-devices-allocated`` (repair reads it fresh)."""
    priority: int = 0
    """``spec.priority`` as admission resolved it; 0 (none) never preempts."""
    never_preempts: bool = False
    """``spec.preemptionPolicy: Never``."""
    started_at: float | None = None
    """``status.startTime`` (wall clock), the start of the work an eviction would lose."""
    grace_seconds: float = DEFAULT_GRACE
    """``spec.terminationGracePeriodSeconds``: how long an eviction takes at most."""
    deleting: bool = False
    """``metadata.deletionTimestamp`` is set: the pod was asked to stop and ends within its
    grace period (its claim holds until then)."""
    gated: Gated | None = None
    """What admission needs, for a pod carrying rgpu's scheduling gate; ``None`` otherwise."""
    ready_gate: bool = False
    """The pod declares the readiness gate ``rgpu.io/remote-gpu-ready``."""
    ready_gate_status: str | None = None
    """That condition's ``status`` as last written (``None`` when absent)."""
    ips: tuple[str, ...] = ()
    """``status.podIPs`` (``podIP`` when that is all there is), valid addresses only: where
    the pod's connections come from, once the kubelet reported them. Server policies admit
    holders by them."""

    finished: bool = field(init=False)
    """The phase is ``Succeeded`` or ``Failed``."""
    bound: bool = field(init=False)
    """The pod has a node."""

    def __post_init__(self) -> None:
        # Read on every verdict about a claim (many per decision): worked out once, here.
        object.__setattr__(self, "finished", self.phase in FINISHED_PHASES)
        object.__setattr__(self, "bound", bool(self.node_name))

    @property
    def ref(self) -> PodRef:
        return PodRef(uid=self.uid, namespace=self.namespace, name=self.name)

    @property
    def admissible(self) -> bool:
        """Whether the pod waits for rgpu to admit it: its gate is the last one, and it is
        neither finished nor being deleted."""
        return (
            self.gated is not None and self.gated.ours and not self.deleting and not self.finished
        )


def _mapping(raw: object) -> Mapping[str, object]:
    return raw if isinstance(raw, Mapping) else {}


def _text(raw: Mapping[str, object], key: str) -> str:
    value = raw.get(key)
    return value if isinstance(value, str) else ""


def _number(raw: Mapping[str, object], key: str, default: float) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


def _moment(text: str) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_info(
    raw: Mapping[str, object], resources: ResourceSettings = DEFAULT_RESOURCES
) -> PodInfo | None:
    """Slim a raw Pod (as the apiserver sends it) down to a ``PodInfo``; ``None`` without a uid.
    ``resources`` names the extended resources a gated pod's ask is read from."""
    meta = _mapping(raw.get("metadata"))
    spec = _mapping(raw.get("spec"))
    status = _mapping(raw.get("status"))
    uid = _text(meta, "uid")
    if not uid:
        return None
    node = _text(spec, "nodeName")
    return PodInfo(
        uid=PodUID(uid),
        namespace=sys.intern(_text(meta, "namespace")),
        name=_text(meta, "name"),
        node_name=sys.intern(node) if node else None,
        phase=sys.intern(_text(status, "phase") or "Pending"),
        scheduler_name=sys.intern(_text(spec, "schedulerName") or "default-scheduler"),
        has_allocated=ANNOTATION_ALLOCATED in _mapping(meta.get("annotations")),
        priority=int(_number(spec, "priority", 0)),
        never_preempts=_text(spec, "preemptionPolicy") == "Never",
        started_at=_moment(_text(status, "startTime")),
        grace_seconds=_number(spec, "terminationGracePeriodSeconds", DEFAULT_GRACE),
        deleting=bool(_text(meta, "deletionTimestamp")),
        gated=read_gated(raw, resources),
        ready_gate=_declares_gate(spec),
        ready_gate_status=_gate_status(status),
        ips=_addresses(status),
    )


def _addresses(status: Mapping[str, object]) -> tuple[str, ...]:
    """The pod's IP addresses as reported; anything that is not one is dropped here, once,
    so a policy is never written from it. ``podIPs[0]`` is ``podIP``: a single-stack pod (the
    common case, on every pod event) reads just that."""
    listed = status.get("podIPs")
    if isinstance(listed, list) and len(listed) > 1:
        found = tuple(
            ip
            for entry in listed
            if isinstance(ip := _mapping(entry).get("ip"), str) and _is_address(ip)
        )
        if found:
            return found
    single = status.get("podIP")
    if isinstance(single, str) and single and _is_address(single):
        return (single,)
    return ()


def _is_address(text: str) -> bool:
    # inet_pton, not ipaddress: this runs for every pod event, and is ten times cheaper.
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, text)
        except (OSError, ValueError):
            continue
        return True
    return False


def _declares_gate(spec: Mapping[str, object]) -> bool:
    gates = spec.get("readinessGates")
    return isinstance(gates, list) and any(
        _mapping(gate).get("conditionType") == READINESS_GATE for gate in gates
    )


def _gate_status(status: Mapping[str, object]) -> str | None:
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        entry = _mapping(condition)
        if entry.get("type") == READINESS_GATE:
            value = entry.get("status")
            return sys.intern(value) if isinstance(value, str) else None
    return None


class PodIndex:
    """Every pod the watch has delivered, by uid, plus the uids known to be deleted.

    A pod missing from the cache may just not have been delivered yet; a pod whose deletion
    was seen (or that vanished between two lists) is gone for good, since uids are never
    reused. Claims of gone pods are invalid at once, without waiting for the booking TTL.
    """

    __slots__ = ("_deleting", "_gone", "_limit", "_pods", "buried", "by_uid", "synced")

    def __init__(self, *, tombstones: int = TOMBSTONES) -> None:
        self._pods: dict[PodUID, PodInfo] = {}
        self._deleting: set[PodUID] = set()
        self._gone: OrderedDict[PodUID, None] = OrderedDict()
        self._limit = tombstones
        self.synced = False
        """Whether a complete list has been loaded (before that, absence means nothing)."""
        # Read-only views a decision reads without calling back here (kept, never rebound).
        self.by_uid: Mapping[str, PodInfo] = MappingProxyType(
            cast("dict[str, PodInfo]", self._pods)
        )
        """Every pod delivered, by uid."""
        self.buried: Mapping[str, None] = MappingProxyType(cast("dict[str, None]", self._gone))
        """The uids known to be deleted (``in`` is all it answers)."""

    def __len__(self) -> int:
        return len(self._pods)

    def __iter__(self) -> Iterator[PodInfo]:
        return iter(tuple(self._pods.values()))

    def get(self, uid: str) -> PodInfo | None:
        return self._pods.get(PodUID(uid))

    def put(self, pod: PodInfo) -> PodInfo | None:
        """Store ``pod``; returns what was stored before under its uid."""
        before = self._pods.get(pod.uid)
        self._pods[pod.uid] = pod
        if pod.deleting:
            self._deleting.add(pod.uid)
        else:
            self._deleting.discard(pod.uid)
        return before

    def remove(self, uid: str) -> PodInfo | None:
        """Forget a deleted pod and remember that it is gone."""
        self._bury((PodUID(uid),))
        self._deleting.discard(PodUID(uid))
        return self._pods.pop(PodUID(uid), None)

    def deleting(self) -> frozenset[PodUID]:
        """The pods asked to stop that have not ended yet, as far as the watch has said."""
        return frozenset(self._deleting)

    def gone(self, uid: str) -> bool:
        """Whether the pod is known to be deleted."""
        return PodUID(uid) in self._gone

    def replace_all(
        self, pods: Mapping[PodUID, PodInfo]
    ) -> list[tuple[PodInfo | None, PodInfo | None]]:
        """Swap in a fresh list's content; returns every change as ``(before, after)``
        (``after`` is ``None`` for pods that vanished, which are buried)."""
        old = self._pods
        gone = [p for uid, p in old.items() if uid not in pods]
        changes: list[tuple[PodInfo | None, PodInfo | None]] = [(p, None) for p in gone]
        changes.extend((old.get(uid), p) for uid, p in pods.items() if old.get(uid) != p)
        self._pods.clear()
        self._pods.update(pods)
        self._deleting = {uid for uid, p in pods.items() if p.deleting}
        self._bury(p.uid for p in gone)
        self.synced = True
        return changes

    def _bury(self, uids: Iterable[PodUID]) -> None:
        for uid in uids:
            self._gone[uid] = None
            self._gone.move_to_end(uid)
        while len(self._gone) > self._limit:
            self._gone.popitem(last=False)
