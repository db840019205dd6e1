"""When the pool is short, teams ask "who is in line before us, and why do we wait?";
``rgpu queue`` answers from the allocator's own view (``GET /v1/queue``): the pods behind
rgpu's scheduling gate in the order admission considers them, each with its reason, and how
the pool is shared between namespaces (cards held, quota, weight). ``rgpu explain`` shows one
pod's line of it (``find_queued``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rgpu_contracts import AdmissionQueue, ContractError, NamespaceShare, PodRef, QueuedPod
from rgpu_placement import ADMISSION_GATE, waits_for_rgpu

__all__ = ["Queued", "fetch_queue", "find_queued", "queue_json", "render_queue", "render_queued"]

DRY_RUN_REASONS = ("NoFit", "NeverFits")
"""Reasons a dry run's per-server verdicts explain further; any other reason (a quota, a gang,
a server kept for a higher priority) is the whole story, and a dry run would say it fits."""


async def read_queue(http: httpx.AsyncClient, allocator_url: str) -> AdmissionQueue:
    """The allocator's queue; raises ``httpx.HTTPError`` or ``ContractError`` with the cause."""
    answer = await http.get(f"{allocator_url}/v1/queue")
    answer.raise_for_status()
    return AdmissionQueue.from_dict(answer.json())


async def fetch_queue(allocator_url: str, *, timeout: float = 5.0) -> AdmissionQueue:
    """The allocator's queue, over a client of its own (``read_queue``)."""
    async with httpx.AsyncClient(timeout=timeout) as client:
        return await read_queue(client, allocator_url)


@dataclass(frozen=True, slots=True, kw_only=True)
class Queued:
    """One gated pod's place in the admission queue, as ``rgpu explain`` shows it."""

    entry: QueuedPod | None
    """``None``: the allocator does not list it (another gate first, or not seen yet)."""
    waiting: int
    """Pods in the queue."""
    share: NamespaceShare | None = None
    problem: str = ""
    """Why the queue could not be read."""
    others_first: bool = False
    """Other systems' gates are still on the pod: rgpu does not consider it yet."""

    @property
    def dry_run_helps(self) -> bool:
        return self.entry is None or self.entry.reason in DRY_RUN_REASONS


async def find_queued(
    http: httpx.AsyncClient, allocator_url: str, pod: PodRef, gates: tuple[str, ...]
) -> Queued | None:
    """``pod``'s place in the queue when it carries rgpu's gate, else ``None``."""
    if ADMISSION_GATE not in gates:
        return None
    if not waits_for_rgpu(gates):
        return Queued(entry=None, waiting=0, others_first=True)
    try:
        queue = await read_queue(http, allocator_url)
    except (httpx.HTTPError, ValueError, ContractError) as exc:
        return Queued(entry=None, waiting=0, problem=f"the admission queue is unreadable: {exc}")
    entry = next((p for p in queue.pods if p.pod.uid == pod.uid), None)
    share = next((n for n in queue.namespaces if n.namespace == pod.namespace), None)
    return Queued(entry=entry, waiting=len(queue.pods), share=share)


def render_queued(queued: Queued) -> list[Text]:
    """Lines for ``rgpu explain``: place in line and reason, the namespace's share."""
    if queued.others_first:
        return []
    if queued.problem:
        return [Text(queued.problem, style="yellow")]
    entry = queued.entry
    if entry is None:
        line = "behind rgpu's scheduling gate; the allocator does not list it yet (admitting?)"
        return [Text(line, style="yellow")]
    lines = [
        Text(
            f"admission queue: {entry.position + 1} of {queued.waiting} "
            f"(priority {entry.priority}, {entry.cards} card(s)), {entry.reason}: {entry.message}",
            style="yellow" if entry.reason in DRY_RUN_REASONS else "red",
        )
    ]
    share = queued.share
    if share is not None:
        quota = "no quota" if share.quota is None else f"quota {share.quota}"
        lines.append(
            Text(
                f"namespace {share.namespace}: {share.held} card(s) held, {quota}, "
                f"weight {share.weight}"
            )
        )
    return lines


def _age(since: float, now: float) -> str:
    seconds = max(0, int(now - since))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def _pods(queue: AdmissionQueue, namespace: str | None, now: float) -> Table:
    table = Table(title="waiting behind rgpu's scheduling gate, in admission order", expand=False)
    for column in ("#", "pod", "prio", "cards", "reason", "waiting"):
        table.add_column(column, overflow="fold", no_wrap=column == "reason")
    for pod in queue.pods:
        if namespace is not None and pod.pod.namespace != namespace:
            continue
        table.add_row(
            str(pod.position + 1),
            pod.pod.key,
            str(pod.priority),
            str(pod.cards),
            pod.reason,
            _age(pod.since, now),
        )
    return table


def _why(queue: AdmissionQueue, namespace: str | None) -> Text:
    """One line per waiting pod saying why, below the table: too long for a column at 80."""
    lines = Text()
    for pod in queue.pods:
        if namespace is None or pod.pod.namespace == namespace:
            lines.append(f"{pod.pod.key}", style="bold")
            lines.append(f": {pod.message}\n")
    return lines


def _shares(queue: AdmissionQueue, namespace: str | None) -> Table:
    table = Table(title="namespaces", expand=False)
    for column in ("namespace", "cards held", "quota", "weight"):
        table.add_column(column)
    for share in queue.namespaces:
        if namespace is not None and share.namespace != namespace:
            continue
        quota = "no limit" if share.quota is None else str(share.quota)
        table.add_row(share.namespace, str(share.held), quota, str(share.weight))
    return table


def render_queue(
    queue: AdmissionQueue, *, namespace: str | None = None, now: float | None = None
) -> RenderableType:
    """The queue and the namespaces' shares as tables (one namespace with ``namespace``)."""
    when = time.time() if now is None else now
    parts: list[RenderableType] = []
    if queue.config_problem:
        parts.append(
            Text(
                f"queue configuration refused, the last good one is in force: "
                f"{queue.config_problem}",
                style="red",
            )
        )
    waiting = [p for p in queue.pods if namespace is None or p.pod.namespace == namespace]
    if waiting:
        parts.append(_pods(queue, namespace, when))
        parts.append(_why(queue, namespace))
    else:
        parts.append(Text("no pod waits for a remote GPU"))
    parts.append(_shares(queue, namespace))
    return Group(*parts)


def queue_json(queue: AdmissionQueue, *, namespace: str | None = None) -> str:
    """The queue as JSON (the allocator's contract), filtered to ``namespace`` when given."""
    raw = queue.to_dict()
    if namespace is not None:
        raw["pods"] = [p for p in raw["pods"] if p["pod"]["namespace"] == namespace]
        raw["namespaces"] = [n for n in raw["namespaces"] if n["namespace"] == namespace]
    return json.dumps(raw, indent=2)
