"""``GET /v1/queue`` shows each gated pod's place in line and why it waits, as a pass would
decide now; the translation from a pass's verdicts to the wire contract lives here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rgpu_contracts import AdmissionQueue, NamespaceShare, QueuedPod
from rgpu_placement import demand_of

from .pods import PodInfo
from .queues import Queues
from .verdicts import Verdict, Wait

__all__ = ["QueueEntry", "admission_queue"]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueEntry:
    """One gated pod as ``GET /v1/queue`` shows it."""

    pod: PodInfo
    position: int
    verdict: Verdict


def admission_queue(
    entries: list[QueueEntry], *, held: Mapping[str, int], queues: Queues
) -> AdmissionQueue:
    """The queue as ``GET /v1/queue`` serves it, with every namespace that holds cards, waits
    or is configured."""
    config = queues.config
    names = {*held, *config.namespaces, *(e.pod.namespace for e in entries)}
    shares = tuple(
        NamespaceShare(
            namespace=n,
            held=held.get(n, 0),
            quota=config.quota(n).cards,
            weight=config.quota(n).weight,
        )
        for n in sorted(names)
    )
    return AdmissionQueue(
        pods=tuple(_queued(e) for e in entries), namespaces=shares, config_problem=queues.problem
    )


def _queued(entry: QueueEntry) -> QueuedPod:
    verdict, pod = entry.verdict, entry.pod
    gated = pod.gated
    containers = gated.containers if gated is not None else ()
    wait = verdict.wait
    return QueuedPod(
        pod=pod.ref,
        position=entry.position,
        priority=pod.priority,
        cards=demand_of(containers).effective_count if containers else 0,
        reason=wait.value if wait is not None else Wait.ADMITTING.value,
        message=verdict.message if wait is not None else "a server is booked for this pod",
        since=gated.created_at if gated is not None else 0.0,
    )
