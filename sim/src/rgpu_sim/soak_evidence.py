"""The soak's verdict must rest on what the cluster itself saw, never on
rgpu's books. This records it: every version of every claim Lease and every change of every pod,
straight from the simulated apiserver's storage (in process, so the injected faults do not thin
the record), ordered by the apiserver's own resourceVersion — one clock for both, so "the claim
was still there when the pod finished" is a comparison of two numbers, not of two timers."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskStatus

from rgpu_contracts import ANNOTATION_ALLOCATED, ContractError, decode_devices, split_card_id
from rgpu_kubesim import SimApiServer
from rgpu_kubesim.errors import ApiError

__all__ = [
    "ANNOTATION_CLAIMS",
    "ANNOTATION_SERVER",
    "Evidence",
    "LeaseVersion",
    "NominationSeen",
    "PodLife",
    "record_evidence",
]

logger = logging.getLogger(__name__)

ANNOTATION_CLAIMS = "rgpu.io/claims"
ANNOTATION_SERVER = "rgpu.io/server"
ANNOTATION_NOMINATION = "rgpu.io/nomination"
ANNOTATION_RETRY_AT = "rgpu.io/retry-at"
"""What the filter path writes on a refused pod to send kube-scheduler back to it (a nudge)."""
ADMISSION_GATE = "rgpu.io/admission"
"""rgpu's scheduling gate: a GPU pod waits behind it until the allocator has booked it."""
_TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True, kw_only=True)
class NominationSeen:
    """A nomination as a Lease version carried it: who the server is promised to, until when
    (wall-clock seconds, the allocator's clock), and for whom its victims were to go."""

    uid: str
    priority: int
    cards: tuple[str, ...]
    victims: tuple[str, ...]
    """Victims' pod uids."""
    expires_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseVersion:
    """One version of a server's claim Lease: which pod held which cards."""

    rv: int
    at: float
    server: str
    holders: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``(pod uid, card ids)`` per claim."""
    nomination: NominationSeen | None = None
    wall: float = 0.0
    """``time.time()`` when recorded: comparable with a nomination's expiry."""

    @property
    def uids(self) -> frozenset[str]:
        return frozenset(uid for uid, _ in self.holders)

    def holding(self, unit: str) -> frozenset[str]:
        """Pods holding ``unit``: a card id, or the server's name for all of it."""
        if unit == self.server:
            return self.uids
        return frozenset(uid for uid, cards in self.holders if unit in cards)


@dataclass(slots=True, kw_only=True)
class PodLife:
    """One pod as the apiserver saw it: when it was bound (to which cards), when it ended."""

    uid: str
    key: str
    cards: tuple[str, ...] = ()
    """Card ids from ``hami.io/remote-gpu-devices-allocated`` at binding."""
    bound_rv: int | None = None
    bound_at: float | None = None
    end_rv: int | None = None
    """First version with a terminal phase, or the deletion."""
    end_at: float | None = None
    phase: str = "Pending"
    deleted: bool = False
    priority: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    created_rv: int = 0
    created_at: float = 0.0
    grace_seconds: float = 30.0
    """``terminationGracePeriodSeconds``, or the deletion's grace once it began."""
    deleting_rv: int | None = None
    """First version with ``deletionTimestamp`` (or the removal, when it had none)."""
    deleting_at: float | None = None
    healthy: list[tuple[int, bool]] = field(default_factory=list)
    """``(rv, healthy)`` at each change, healthy as a disruption budget counts it (Running,
    Ready, not being deleted)."""
    gated: bool = False
    """Created carrying rgpu's scheduling gate."""
    lifted_rv: int | None = None
    """First version without rgpu's gate, for a pod created with it."""
    lifted_at: float | None = None
    nudges: list[int] = field(default_factory=list)
    """Versions that changed ``rgpu.io/retry-at`` while the pod carried rgpu's gate."""
    gate_on: bool = False
    """Whether the last version seen carried rgpu's gate."""
    retry_at: str = ""
    """``rgpu.io/retry-at`` in the last version seen."""

    def healthy_at(self, rv: int) -> bool:
        """Whether the pod was healthy in the last version before ``rv``."""
        state = False
        for seen, value in self.healthy:
            if seen >= rv:
                break
            state = value
        return state

    @property
    def server(self) -> str | None:
        servers = {split_card_id(card)[0] for card in self.cards}
        return servers.pop() if len(servers) == 1 else None


@dataclass(slots=True)
class Evidence:
    """Everything recorded; filled while the soak runs."""

    leases: list[LeaseVersion] = field(default_factory=list)
    pods: dict[str, PodLife] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)
    """Where the record may miss changes (a watch that could not resume)."""
    events: dict[str, set[str]] = field(default_factory=dict)
    """Reasons of the Events written about each pod, by pod uid."""
    said: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    """What the Events about each pod said, by pod uid, when it changed (``time.monotonic``):
    a pod's trace shows why it waited (``soak_trace``)."""

    def on_event(self, kind: str, event: Mapping[str, Any]) -> None:
        regarding = event.get("involvedObject") or {}
        if kind == "DELETED" or regarding.get("kind") != "Pod" or not regarding.get("uid"):
            return
        uid, reason = str(regarding["uid"]), str(event.get("reason"))
        self.events.setdefault(uid, set()).add(reason)
        text = f"{reason}: {event.get('message') or ''}"
        said = self.said.setdefault(uid, [])
        if not said or said[-1][1] != text:
            said.append((time.monotonic(), text))

    def on_lease(self, kind: str, lease: Mapping[str, Any]) -> None:
        meta = lease.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        server = annotations.get(ANNOTATION_SERVER)
        if not server:
            return
        holders = () if kind == "DELETED" else _holders(annotations)
        nomination = None if kind == "DELETED" else _nomination(annotations)
        rv = int(meta.get("resourceVersion", 0))
        self.leases.append(
            LeaseVersion(
                rv=rv,
                at=time.monotonic(),
                server=server,
                holders=holders,
                nomination=nomination,
                wall=time.time(),
            )
        )

    def on_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        life = self.pods.setdefault(
            uid, PodLife(uid=uid, key=f"{meta.get('namespace')}/{meta.get('name')}")
        )
        rv = int(meta.get("resourceVersion", 0))
        spec = pod.get("spec") or {}
        if not life.created_rv:
            life.created_rv, life.created_at = rv, time.monotonic()
            life.priority = int(spec.get("priority") or 0)
            life.labels = dict(meta.get("labels") or {})
            life.grace_seconds = float(spec.get("terminationGracePeriodSeconds", 30))
        deleting = kind == "DELETED" or bool(meta.get("deletionTimestamp"))
        if deleting and life.deleting_rv is None:
            life.deleting_rv, life.deleting_at = rv, time.monotonic()
            grace = meta.get("deletionGracePeriodSeconds")
            life.grace_seconds = life.grace_seconds if grace is None else float(grace)
        healthy = kind != "DELETED" and is_healthy(pod)
        if not life.healthy or life.healthy[-1][1] != healthy:
            life.healthy.append((rv, healthy))
        if life.bound_rv is None and spec.get("nodeName"):
            life.bound_rv, life.bound_at = rv, time.monotonic()
            life.cards = _cards((meta.get("annotations") or {}).get(ANNOTATION_ALLOCATED, ""))
        _follow_gate(life, kind, rv, spec, meta)
        life.phase = str((pod.get("status") or {}).get("phase") or life.phase)
        ended = kind == "DELETED" or life.phase in _TERMINAL
        life.deleted = life.deleted or kind == "DELETED"
        if ended and life.end_rv is None:
            life.end_rv, life.end_at = rv, time.monotonic()


def _follow_gate(
    life: PodLife, kind: str, rv: int, spec: Mapping[str, Any], meta: Mapping[str, Any]
) -> None:
    """Note the gate's lift and any nudge (a ``retry-at`` change) written while it was on."""
    gate_on = any(
        isinstance(g, Mapping) and g.get("name") == ADMISSION_GATE
        for g in spec.get("schedulingGates") or ()
    )
    retry = str((meta.get("annotations") or {}).get(ANNOTATION_RETRY_AT) or "")
    if life.created_rv == rv:
        life.gated = gate_on
    elif life.gate_on and retry != life.retry_at:
        life.nudges.append(rv)
    if life.gate_on and not gate_on and kind != "DELETED" and life.lifted_rv is None:
        life.lifted_rv, life.lifted_at = rv, time.monotonic()
    life.gate_on, life.retry_at = gate_on, retry


def _holders(annotations: Mapping[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    try:
        claims = json.loads(annotations.get(ANNOTATION_CLAIMS) or "[]")
        return tuple((str(c["pod"]["uid"]), tuple(map(str, c["cards"]))) for c in claims)
    except (ValueError, KeyError, TypeError):
        return (("<unreadable claims>", ()),)


def is_healthy(pod: Mapping[str, Any]) -> bool:
    """Running, Ready and not being deleted: what a PodDisruptionBudget counts as healthy."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def _nomination(annotations: Mapping[str, Any]) -> NominationSeen | None:
    raw = annotations.get(ANNOTATION_NOMINATION)
    if not raw:
        return None
    try:
        found = json.loads(raw)
        return NominationSeen(
            uid=str(found["pod"]["uid"]),
            priority=int(found["priority"]),
            cards=tuple(map(str, found["cards"])),
            victims=tuple(str(v["uid"]) for v in found["victims"]),
            expires_at=float(found["expiresAt"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _cards(value: str) -> tuple[str, ...]:
    try:
        return tuple(entry.card for part in decode_devices(value) for entry in part)
    except ContractError:
        return ()


async def record_evidence(
    sim: SimApiServer,
    evidence: Evidence,
    namespace: str,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Record Leases in ``namespace``, all pods and the Events about them until cancelled."""
    async with anyio.create_task_group() as tg:
        await tg.start(_follow, sim, "leases", namespace, evidence.on_lease, evidence)
        await tg.start(_follow, sim, "pods", None, evidence.on_pod, evidence)
        await tg.start(_follow, sim, "events", None, evidence.on_event, evidence)
        task_status.started()


async def _follow(
    sim: SimApiServer,
    resource: str,
    namespace: str | None,
    record: Any,
    evidence: Evidence,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    version, started = "", False
    while True:
        try:
            async with sim.store.watch(
                resource, namespace=namespace, resource_version=version, audit=True
            ) as events:
                if not started:
                    started = True
                    task_status.started()
                async for event in events:
                    obj = event["object"]
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        record(event["type"], obj)
                        version = str(obj["metadata"]["resourceVersion"])
        except ApiError as exc:
            # Resuming past a compaction: what changed in between is unknown to the verdict.
            evidence.gaps.append(f"{resource} watch resumed from a list after {exc}")
            version = ""
