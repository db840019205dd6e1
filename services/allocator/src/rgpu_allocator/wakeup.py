"""A pod refused for lack of remote GPUs sits in kube-scheduler's
unschedulable queue until a cluster event it recognises (or a 5-minute flush); a freed claim
is not such an event. So the allocator remembers whom it refused and, when capacity appears,
changes an annotation (``rgpu.io/retry-at``) on a few of them: any update of a pending pod
moves it back to the active queue, and kube-scheduler retries it within about a second.

Bounded on every axis: refused pods kept (oldest dropped first), pods nudged per round
(oldest first), and patches per second.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime

import anyio
from anyio.abc import TaskStatus
from opentelemetry import trace

from rgpu_contracts import PodRef, PodUID
from rgpu_runtime import KubeError, KubeNotFound

from .annotations import ANNOTATION_RETRY_AT
from .clients import KubeApi

__all__ = ["Nudger", "Refused", "retry_stamp"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

REMEMBERED = 1000
"""Refused pods kept; beyond that the oldest are dropped (they still get the 5-minute flush)."""
PER_ROUND = 16
"""Pods nudged per capacity event: a freed server can take one pod in server granularity, a
few in card granularity; more would only have kube-scheduler refuse them again."""
PER_SECOND = 50.0
"""Upper bound on nudge patches per second, so a flapping fleet cannot flood the apiserver."""


class Refused:
    """Pods refused for lack of capacity, oldest first."""

    __slots__ = ("_limit", "_pods")

    def __init__(self, *, limit: int = REMEMBERED) -> None:
        self._pods: OrderedDict[PodUID, PodRef] = OrderedDict()
        self._limit = limit

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def remember(self, pod: PodRef, *, first: bool = False) -> None:
        """Note a refusal; a pod refused again keeps its place in line, unless ``first``: a
        pod held to a server freed for it (preemption) goes to the head, so the release of
        its victims' cards nudges it whatever the queue behind."""
        self._pods.setdefault(pod.uid, pod)
        while len(self._pods) > self._limit:
            self._pods.popitem(last=False)
        if first and pod.uid in self._pods:
            self._pods.move_to_end(pod.uid, last=False)

    def forget(self, uid: str) -> None:
        """The pod got a server or is gone."""
        self._pods.pop(PodUID(uid), None)

    def take(self, count: int) -> list[PodRef]:
        """Remove and return up to ``count`` of the oldest refused pods."""
        taken: list[PodRef] = []
        while self._pods and len(taken) < count:
            taken.append(self._pods.popitem(last=False)[1])
        return taken


def retry_stamp(now: float) -> str:
    """A value that changes on every nudge (RFC 3339 with microseconds)."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Nudger:
    """Annotates refused pods when capacity appears; run it in the lifespan's task group."""

    __slots__ = ("_api", "_clock", "_count", "_pending", "_refused", "_wake")

    def __init__(
        self,
        api: KubeApi,
        refused: Refused,
        *,
        clock: Callable[[], float],
        count: Callable[[], None],
    ) -> None:
        self._api = api
        self._refused = refused
        self._clock = clock
        self._count = count
        self._pending = False
        self._wake: anyio.Event | None = None

    def notify(self) -> None:
        """Capacity appeared; callable from synchronous code (watch handlers)."""
        self._pending = True
        if self._wake is not None:
            self._wake.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Nudge a round of refused pods after each capacity event, forever."""
        task_status.started()
        while True:
            if not self._pending:
                self._wake = anyio.Event()
                await self._wake.wait()
            self._pending = False
            await self.nudge_round()

    async def nudge_round(self) -> None:
        """Nudge up to ``PER_ROUND`` of the oldest refused pods, at most ``PER_SECOND``."""
        pods = self._refused.take(PER_ROUND)
        if not pods:
            return
        with tracer.start_as_current_span("nudge", attributes={"pods": len(pods)}):
            for pod in pods:
                await self._nudge(pod)
                await anyio.sleep(1.0 / PER_SECOND)

    async def _nudge(self, pod: PodRef) -> None:
        stamp = retry_stamp(self._clock())
        try:
            await self._api.annotate_pod(pod.namespace, pod.name, {ANNOTATION_RETRY_AT: stamp})
        except KubeNotFound:
            return
        except KubeError as exc:
            logger.warning("could not nudge pod %s: %s", pod.key, exc)
            return
        self._count()
