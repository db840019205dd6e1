""" "why is my pod waiting?" is the question operators ask most. ``rgpu
explain`` reads the pod, asks the allocator for a dry-run decision with per-server reasons, and
shows the pod's recent events — the same inputs the extender uses, without booking anything.
When the pod is preempting (DESIGN §11), the nomination on a server's claim Lease says which
server is being freed for it, until when, and which pods are being evicted for it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from rich.console import Group
from rich.table import Table
from rich.text import Text

from rgpu_contracts import Allocation, AllocationRequest, ContractError, NoFit, PodRef, PodUID
from rgpu_placement import ANNOTATION_NOMINATION, Nomination, read_demand
from rgpu_runtime import KubeClient, Settings, creation_of, kube_client

__all__ = [
    "CLAIM_LEASES",
    "Explanation",
    "Nominated",
    "explain",
    "find_nomination",
    "nomination_in",
    "render_explanation",
    "render_nomination",
]

CLAIM_LEASES = "app.kubernetes.io/managed-by=rgpu"
"""The label selector of the allocator's claim Leases."""
SERVER_ANNOTATION = "rgpu.io/server"


@dataclass(frozen=True, slots=True, kw_only=True)
class Nominated:
    """A server being freed for the pod: the promise stored on that server's Lease."""

    server: str
    nomination: Nomination


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    """What the allocator would do for the pod now, and what the cluster said about it."""

    pod: PodRef
    node: str | None
    allocation: Allocation | None
    nofit: NoFit | None
    problem: str
    events: tuple[str, ...]
    nominated: Nominated | None = None
    trace_id: str = ""
    """The trace of the pod's creation (its ``rgpu.io/trace``), where its story starts."""


async def _events(kube: KubeClient, pod: PodRef) -> tuple[str, ...]:
    listing = await kube.call_raw(kube.core.list_namespaced_event, pod.namespace)
    mine = [
        e
        for e in listing.get("items") or []
        if (e.get("involvedObject") or {}).get("uid") == pod.uid
    ]
    mine.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return tuple(
        f"{e.get('type', '')} {e.get('reason', '')}: {e.get('message', '')}" for e in mine[-8:]
    )


def nomination_in(leases: Iterable[Mapping[str, Any]], uid: str) -> Nominated | None:
    """The nomination of pod ``uid`` among claim Leases as the apiserver lists them (the
    latest, if several); unreadable nominations are skipped."""
    found: list[Nominated] = []
    for lease in leases:
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(ANNOTATION_NOMINATION)
        if not isinstance(text, str):
            continue
        try:
            nomination = Nomination.from_dict(json.loads(text))
        except (ValueError, ContractError):
            continue
        if nomination.pod.uid == uid:
            server = str(annotations.get(SERVER_ANNOTATION, ""))
            found.append(Nominated(server=server, nomination=nomination))
    return max(found, key=lambda n: n.nomination.nominated_at, default=None)


async def find_nomination(kube: KubeClient, namespace: str, uid: str) -> Nominated | None:
    """The nomination of pod ``uid`` on the claim Leases in ``namespace`` (rgpu's)."""
    api = kube.coordination
    listing = await kube.call_raw(api.list_namespaced_lease, namespace, label_selector=CLAIM_LEASES)
    return nomination_in(listing.get("items") or [], uid)


async def _decide(
    settings: Settings, pod: dict[str, Any], ref: PodRef
) -> tuple[Allocation | None, NoFit | None, str]:
    resources = settings.resources
    demand = read_demand(pod, count_resource=resources.count, memory_resource=resources.memory)
    if not demand.asks:
        return None, None, f"the pod asks for no {resources.count}"
    request = AllocationRequest(
        pod=ref, containers=demand.requests(), dry_run=True, cuda_major=demand.cuda_major
    )
    async with httpx.AsyncClient(base_url=settings.peers.allocator_url, timeout=10) as client:
        answer = await client.post("/v1/allocations", json=request.to_dict())
    if answer.status_code == 200:
        return Allocation.from_dict(answer.json()), None, ""
    if answer.status_code == 409:
        return None, NoFit.from_dict(answer.json()), ""
    return None, None, f"allocator answered {answer.status_code}: {answer.text[:300]}"


async def explain(settings: Settings, namespace: str, name: str) -> Explanation:
    """Gather the explanation; raises ``KubeError``, ``httpx.HTTPError`` or ``ContractError``."""
    async with kube_client(settings) as kube:
        pod = await kube.call_raw(kube.core.read_namespaced_pod, name, namespace)
        meta = pod["metadata"]
        ref = PodRef(uid=PodUID(meta["uid"]), namespace=namespace, name=name)
        events = await _events(kube, ref)
        nominated = await find_nomination(kube, settings.scheduling.namespace, ref.uid)
    node = pod.get("spec", {}).get("nodeName")
    allocation, nofit, problem = await _decide(settings, pod, ref)
    creation = creation_of(pod)
    return Explanation(
        trace_id="" if creation is None else f"{creation.trace_id:032x}",
        pod=ref,
        node=node,
        allocation=allocation,
        nofit=nofit,
        problem=problem,
        events=events,
        nominated=nominated,
    )


def _moment(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_nomination(nominated: Nominated, now: float) -> Text:
    """One line: the server being freed for the pod, until when, and the pods evicted."""
    n = nominated.nomination
    victims = ", ".join(v.key for v in n.victims) or "none"
    live = "expires" if now < n.expires_at else "expired"
    line = (
        f"preempting: server {nominated.server} nominated for this pod (priority {n.priority}), "
        f"{live} {_moment(n.expires_at)}; victims: {victims}"
    )
    return Text(line, style="magenta" if now < n.expires_at else "dim")


def render_explanation(explanation: Explanation, *, now: float | None = None) -> Group:
    """A readable answer: the verdict, the per-server reasons, a nomination, the events."""
    parts: list[Any] = [
        Text(f"pod {explanation.pod.key} (uid {explanation.pod.uid})", style="bold")
    ]
    if explanation.trace_id:
        parts.append(Text(f"trace {explanation.trace_id} (rgpu trace {explanation.pod.key})"))
    if explanation.node:
        parts.append(Text(f"bound to {explanation.node}"))
    if explanation.allocation is not None:
        a = explanation.allocation
        # The allocator is idempotent per pod: a pod that already holds a claim gets it back.
        verb = "holds" if explanation.node or a.state.value != "booked" else "fits now:"
        cards = ", ".join(a.cards)
        line = f"{verb} server {a.server} at {a.endpoint} ({a.state.value}), cards {cards}"
        parts.append(Text(line, style="green"))
    if explanation.nofit is not None:
        parts.append(Text(f"no server fits: {explanation.nofit.message}", style="red"))
        table = Table("server", "reasons", "detail")
        for verdict in explanation.nofit.servers:
            reasons = ", ".join(f"{r.count} {r.reason.value}" for r in verdict.reasons)
            table.add_row(verdict.server, reasons, verdict.detail)
        parts.append(table)
    if explanation.nominated is not None:
        moment = time.time() if now is None else now
        parts.append(render_nomination(explanation.nominated, moment))
    if explanation.problem:
        parts.append(Text(explanation.problem, style="yellow"))
    parts.extend(Text(f"event: {line}", style="dim") for line in explanation.events)
    return Group(*parts)
