""" "why is my pod waiting?" is the question operators ask most. ``rgpu
explain`` reads the pod, asks the allocator for a dry-run decision with per-server reasons, and
shows the pod's recent events — the same inputs the extender uses, without booking anything."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Group
from rich.table import Table
from rich.text import Text

from rgpu_contracts import Allocation, AllocationRequest, NoFit, PodRef, PodUID
from rgpu_placement import read_demand
from rgpu_runtime import KubeClient, Settings, kube_client

__all__ = ["Explanation", "explain", "render_explanation"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    """What the allocator would do for the pod now, and what the cluster said about it."""

    pod: PodRef
    node: str | None
    allocation: Allocation | None
    nofit: NoFit | None
    problem: str
    events: tuple[str, ...]


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


async def _decide(
    settings: Settings, pod: dict[str, Any], ref: PodRef
) -> tuple[Allocation | None, NoFit | None, str]:
    resources = settings.resources
    demand = read_demand(pod, count_resource=resources.count, memory_resource=resources.memory)
    if not demand.asks:
        return None, None, f"the pod asks for no {resources.count}"
    request = AllocationRequest(pod=ref, containers=demand.requests(), dry_run=True)
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
    node = pod.get("spec", {}).get("nodeName")
    allocation, nofit, problem = await _decide(settings, pod, ref)
    return Explanation(
        pod=ref, node=node, allocation=allocation, nofit=nofit, problem=problem, events=events
    )


def render_explanation(explanation: Explanation) -> Group:
    """A readable answer: the verdict, the per-server reasons, the events."""
    parts: list[Any] = [
        Text(f"pod {explanation.pod.key} (uid {explanation.pod.uid})", style="bold")
    ]
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
    if explanation.problem:
        parts.append(Text(explanation.problem, style="yellow"))
    parts.extend(Text(f"event: {line}", style="dim") for line in explanation.events)
    return Group(*parts)
