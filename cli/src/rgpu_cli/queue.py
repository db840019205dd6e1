"""When the pool is short, teams ask "who is in line before us, and why do we wait?";
``rgpu queue`` answers from the allocator's own view (``GET /v1/queue``): the pods behind
rgpu's scheduling gate in the order admission considers them, each with its reason, and how
the pool is shared between namespaces (cards held, quota, weight)."""

from __future__ import annotations

import json
import time

import httpx
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rgpu_contracts import AdmissionQueue

__all__ = ["fetch_queue", "queue_json", "render_queue"]


async def fetch_queue(allocator_url: str, *, timeout: float = 5.0) -> AdmissionQueue:
    """The allocator's queue; raises ``httpx.HTTPError`` or ``ContractError`` with the cause."""
    async with httpx.AsyncClient(timeout=timeout) as client:
        answer = await client.get(f"{allocator_url}/v1/queue")
        answer.raise_for_status()
    return AdmissionQueue.from_dict(answer.json())


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
