"""A gated pod that waits must say why — once per change of reason, where its owner looks
(an Event ``RemoteGPUWaiting`` on the pod, a Warning when the owner must act) — and operators
must see how many wait and why (the queue's gauges). This is that bookkeeping: the reason last
announced per pod, and the families the elected allocator exports.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from rgpu_contracts import PodUID

from .clients import KubeApi, pod_event
from .pods import PodInfo
from .verdicts import WARNINGS, Verdict, Wait

__all__ = ["WAITING", "Waits"]

WAITING = "RemoteGPUWaiting"
"""The Event reason saying why a gated pod waits."""


class Waits:
    """Why each gated pod waits, as last announced."""

    __slots__ = ("_api", "_said")

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._said: dict[PodUID, Wait] = {}

    def announce(self, verdict: Verdict) -> None:
        """Say why ``verdict``'s pod waits, unless that reason was said already."""
        uid, wait = verdict.pod.uid, verdict.wait
        if wait is None or self._said.get(uid) is wait:
            return
        self._said[uid] = wait
        message = f"waiting for a remote GPU ({wait.value}): {verdict.message}"
        event = pod_event(
            verdict.pod.ref, reason=WAITING, message=message, warning=wait in WARNINGS
        )
        self._api.record_event(event)

    def forget(self, uid: str) -> None:
        """The pod was admitted or left the queue."""
        self._said.pop(PodUID(uid), None)

    def counts(
        self, queue: Mapping[PodUID, PodInfo], busy: Callable[[str], bool]
    ) -> Counter[tuple[str, Wait]]:
        """Waiting pods per (namespace, reason); a pod being admitted counts as ``Admitting``."""
        found: Counter[tuple[str, Wait]] = Counter()
        for uid, pod in queue.items():
            reason = Wait.ADMITTING if busy(uid) else self._said.get(uid)
            if reason is not None:
                found[(pod.namespace, reason)] += 1
        return found


def gauges(counts: Counter[tuple[str, Wait]] | None) -> Iterator[Metric]:
    """``rgpu_admission_queue_pods{reason}`` and ``rgpu_queue_pods{namespace,reason}``; empty
    families when ``counts`` is ``None`` (a follower: the leader alone exports them)."""
    by_reason = GaugeMetricFamily(
        "rgpu_admission_queue_pods",
        "Gated pods waiting for admission, by why they wait (Admitting: in flight).",
        labels=["reason"],
    )
    by_namespace = GaugeMetricFamily(
        "rgpu_queue_pods",
        "Gated pods waiting for admission, by namespace and why they wait.",
        labels=["namespace", "reason"],
    )
    if counts is not None:
        for reason in Wait:
            total = sum(n for (_, r), n in counts.items() if r is reason)
            by_reason.add_metric([reason.value], total)
        for (namespace, reason), count in sorted(counts.items()):
            by_namespace.add_metric([namespace, reason.value], count)
    yield by_reason
    yield by_namespace


def busy_in(*sets: Collection[str]) -> Callable[[str], bool]:
    """Whether a uid is in any of ``sets``."""
    return lambda uid: any(uid in s for s in sets)
