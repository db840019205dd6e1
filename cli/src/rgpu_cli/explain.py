""" "why is my pod waiting?" is the question operators ask most. ``rgpu
explain`` reads the pod and its phase. A pending pod gets the allocator's dry-run decision with
per-server reasons (the same inputs the extender uses, without booking anything) — or, when no
server could ever take the request, one line saying so (``capacity``). A pod that is bound or
has finished is described from its own annotations, never from a fresh dry run, which would
offer it a server it does not hold. The pod's recent events follow. When the pod is
preempting, the nomination on a server's claim Lease says which server is being freed for it,
until when, and which pods are being evicted for it.

A pod behind rgpu's scheduling gate waits in the allocator's admission queue: its place in
line, the reason it waits and its namespace's share come from the allocator (``GET
/v1/queue``, the order admission walks); gates of other systems still on it are named first,
since rgpu does not consider the pod before they are lifted."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
from rich.console import Group
from rich.text import Text

from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_ENDPOINT,
    Allocation,
    AllocationRequest,
    ContractError,
    Fleet,
    NoFit,
    PodRef,
    PodUID,
    decode_devices,
)
from rgpu_placement import (
    ADMISSION_GATE,
    ANNOTATION_NOMINATION,
    NeverFits,
    Nomination,
    demand_of,
    lookalikes,
    never_fits,
    read_demand,
    scheduling_gates,
)
from rgpu_runtime.settings import Settings
from rgpu_runtime.telemetry import creation_of

from .kube import cli_kube_client
from .queue import Queued, find_queued, render_queued

if TYPE_CHECKING:
    from rgpu_runtime.kube import KubeClient

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
    phase: str = "Pending"
    """The pod's phase, or ``Terminating`` once its deletion began."""
    holding: str = ""
    """What its annotations say it was given (bound and finished pods), as a sentence."""
    never: NeverFits | None = None
    lookalikes: tuple[str, ...] = ()
    trace_id: str = ""
    """The trace of the pod's creation (its ``rgpu.io/trace``), where its story starts."""
    gates: tuple[str, ...] = ()
    """The pod's scheduling gates, in order (rgpu's is ``rgpu.io/admission``)."""
    queued: Queued | None = None
    """Its place in the admission queue, when it waits behind rgpu's gate."""


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


FINISHED = ("Succeeded", "Failed")


def phase_of(pod: Mapping[str, Any]) -> str:
    """The phase kubectl would show first: ``Terminating`` once deletion began."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    return str((pod.get("status") or {}).get("phase") or "Pending")


def holding_of(pod: Mapping[str, Any]) -> str:
    """The server and cards a bound pod was given, read from the annotations bind wrote."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        parts = decode_devices(str(annotations.get(ANNOTATION_ALLOCATED) or ""))
    except ContractError:
        return "its hami.io/remote-gpu-devices-allocated annotation is unreadable"
    cards = [entry.card for part in parts for entry in part]
    if not cards:
        return ""
    servers = sorted({card.split("/", 1)[0] for card in cards})
    endpoint = annotations.get(ANNOTATION_ENDPOINT) or "?"
    return f"server {', '.join(servers)} at {endpoint}, {_short_cards(cards)}"


async def _decide(
    settings: Settings, pod: dict[str, Any], ref: PodRef, http: httpx.AsyncClient
) -> tuple[Allocation | None, NoFit | None, str]:
    resources = settings.resources
    demand = read_demand(pod, count_resource=resources.count, memory_resource=resources.memory)
    if not demand.asks:
        return None, None, f"the pod asks for no {resources.count}"
    request = AllocationRequest(
        pod=ref, containers=demand.requests(), dry_run=True, cuda_major=demand.cuda_major
    )
    answer = await http.post(
        f"{settings.peers.allocator_url}/v1/allocations", json=request.to_dict()
    )
    if answer.status_code == 200:
        return Allocation.from_dict(answer.json()), None, ""
    if answer.status_code == 409:
        return None, NoFit.from_dict(answer.json()), ""
    return None, None, f"allocator answered {answer.status_code}: {answer.text[:300]}"


async def _never(
    settings: Settings, pod: dict[str, Any], http: httpx.AsyncClient
) -> NeverFits | None:
    """Whether the request could never fit, judged on discovery's fleet at the allocator's
    granularity; None when either cannot be read (the reasons table still explains)."""
    try:
        status = await http.get(f"{settings.peers.allocator_url}/v1/status")
        fleet = await http.get(f"{settings.peers.discovery_url}/v1/fleet")
        granularity = status.json().get("granularity") if status.status_code == 200 else None
        if fleet.status_code != 200 or granularity not in ("server", "card"):
            return None
        parsed = Fleet.from_dict(fleet.json())
    except (httpx.HTTPError, ValueError, ContractError):
        return None
    resources = settings.resources
    demand = read_demand(pod, count_resource=resources.count, memory_resource=resources.memory)
    return never_fits(
        parsed, demand_of(demand.requests(), cuda_major=demand.cuda_major), granularity
    )


async def explain(
    settings: Settings,
    namespace: str,
    name: str,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Explanation:
    """Gather the explanation; raises ``KubeError``, ``httpx.HTTPError`` or ``ContractError``.

    ``transport`` replaces the network to the allocator and discovery (tests)."""
    async with cli_kube_client(settings) as kube:
        pod = await kube.call_raw(kube.core.read_namespaced_pod, name, namespace)
        meta = pod["metadata"]
        ref = PodRef(uid=PodUID(meta["uid"]), namespace=namespace, name=name)
        events = await _events(kube, ref)
        nominated = await find_nomination(kube, settings.scheduling.namespace, ref.uid)
    node = pod.get("spec", {}).get("nodeName")
    resources = settings.resources
    found = lookalikes(pod, count_resource=resources.count, memory_resource=resources.memory)
    creation = creation_of(pod)
    explanation = Explanation(
        trace_id="" if creation is None else f"{creation.trace_id:032x}",
        pod=ref,
        node=node,
        allocation=None,
        nofit=None,
        problem="",
        events=events,
        nominated=nominated,
        phase=phase_of(pod),
        holding=holding_of(pod),
        lookalikes=tuple(lookalike.message for lookalike in found),
    )
    if node or explanation.phase in FINISHED:
        # Bound or done: what it holds is on the pod; a dry run would offer it a new server.
        return explanation
    gates = scheduling_gates(pod)
    async with httpx.AsyncClient(timeout=10, transport=transport) as http:
        queued = await find_queued(http, settings.peers.allocator_url, ref, gates)
        if queued is not None and not queued.dry_run_helps:
            return replace(explanation, gates=gates, queued=queued)
        allocation, nofit, problem = await _decide(settings, pod, ref, http)
        never = await _never(settings, pod, http) if nofit is not None else None
    return replace(
        explanation,
        allocation=allocation,
        nofit=nofit,
        problem=problem,
        never=never,
        gates=gates,
        queued=queued,
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


_TABLE_ROWS = 10
"""Servers listed one per row; beyond this, servers with the same reasons share a row."""


def _short_cards(cards: Iterable[str]) -> str:
    """``gpu-01/GPU-33ff82b3-f349-…`` as ``GPU-33ff82b3``: enough to tell cards apart."""
    short = [card.rsplit("/", 1)[-1][:12] for card in cards]
    return f"{len(short)} card{'s' if len(short) != 1 else ''} ({', '.join(short)})"


def _header(explanation: Explanation) -> Text:
    where = f" on {explanation.node}" if explanation.node else ""
    pod = explanation.pod
    return Text(f"pod {pod.key} (uid {pod.uid}): {explanation.phase}{where}", style="bold")


def _holding(explanation: Explanation) -> Text | None:
    if not explanation.holding:
        return None
    if explanation.phase in FINISHED:
        return Text(f"finished; it held {explanation.holding}", style="dim")
    return Text(f"holds {explanation.holding}", style="green")


def _reason_rows(nofit: NoFit) -> list[tuple[str, str, str]]:
    """(servers, reasons, detail) per server, or per group of servers with the same reasons
    when there are more than ``_TABLE_ROWS`` (50 servers held by 50 pods are one row)."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for verdict in nofit.servers:
        reasons = ", ".join(f"{r.count} {r.reason.value}" for r in verdict.reasons)
        groups.setdefault(reasons, []).append((verdict.server, verdict.detail))
    if len(nofit.servers) <= _TABLE_ROWS:
        return [(s, reasons, d) for reasons, rows in groups.items() for s, d in rows]
    found = []
    for reasons, rows in groups.items():
        names = [server for server, _ in rows]
        shown = ", ".join(names[:3]) + (f" … ({len(names)} servers)" if len(names) > 3 else "")
        details = sorted({detail for _, detail in rows if detail})
        more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
        found.append((shown, reasons, (details[0] if details else "") + more))
    return found


def _reasons(nofit: NoFit) -> list[Text]:
    # Lines, not a table: a table squeezed into 80 columns cuts the reasons' long names.
    return [
        Text(f"  {servers}: {reasons}" + (f" — {detail}" if detail else ""))
        for servers, reasons, detail in _reason_rows(nofit)
    ]


def _gates(explanation: Explanation) -> list[Text]:
    others = [g for g in explanation.gates if g != ADMISSION_GATE]
    if not others:
        return []
    names = ", ".join(others)
    if ADMISSION_GATE in explanation.gates:
        line = f"gated by {names} (not rgpu's): rgpu admits it once those are lifted"
    else:
        line = f"gated by {names} (not rgpu's): kube-scheduler waits for them"
    return [Text(line, style="yellow")]


def _verdict(explanation: Explanation) -> list[Any]:
    parts: list[Any] = [Text(line, style="red") for line in explanation.lookalikes]
    parts.extend(_gates(explanation))
    if explanation.queued is not None:
        parts.extend(render_queued(explanation.queued))
    if explanation.never is not None:
        parts.append(Text(explanation.never.line, style="red"))
    elif explanation.nofit is not None:
        parts.append(Text(f"no server fits now: {explanation.nofit.message}", style="red"))
        parts.extend(_reasons(explanation.nofit))
    if explanation.allocation is not None:
        a = explanation.allocation
        line = f"fits now: server {a.server} at {a.endpoint}, {_short_cards(a.cards)}"
        parts.append(Text(line, style="green"))
    return parts


def render_explanation(explanation: Explanation, *, now: float | None = None) -> Group:
    """A readable answer: phase, what it holds or the verdict, a nomination, the events."""
    parts: list[Any] = [_header(explanation)]
    if explanation.trace_id:
        parts.append(Text(f"trace {explanation.trace_id} (rgpu trace {explanation.pod.key})"))
    holding = _holding(explanation)
    if holding is not None:
        parts.append(holding)
    parts.extend(_verdict(explanation))
    if explanation.nominated is not None:
        moment = time.time() if now is None else now
        parts.append(render_nomination(explanation.nominated, moment))
    if explanation.problem:
        parts.append(Text(explanation.problem, style="yellow"))
    parts.extend(Text(f"event: {line}", style="dim") for line in explanation.events)
    return Group(*parts)
