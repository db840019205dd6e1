"""A pod refused for lack of remote GPUs sits in kube-scheduler's
unschedulable queue until a cluster event it recognises (or a 5-minute flush); a freed claim
is not such an event. So the allocator remembers whom it refused and, when capacity appears,
changes an annotation (``rgpu.io/retry-at``) on a few of them: any update of a pending pod
moves it back to the active queue, and kube-scheduler retries it within about a second.

Bounded on every axis: refused pods kept (oldest dropped first), pods nudged per round
(oldest first), and patches per second.

With several replicas only the elected one nudges, or each capacity event would patch the same
pods once per replica. Decisions are active-active, so the pods a follower refused are unknown
to the leader's own ``Refused``; the leader also keeps ``Waiting``, every pending pod of rgpu's
scheduler as its pod watch shows it (every replica watches every pod), and fills each round
from there after its own refusals, least recently nudged first, so every waiting pod gets its
turn whichever replica refused it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import anyio
from anyio.abc import TaskStatus
from opentelemetry import trace

from rgpu_contracts import PodRef, PodUID
from rgpu_runtime.errors import KubeError, KubeNotFound

from .annotations import ANNOTATION_RETRY_AT
from .clients import KubeApi
from .ledger import Nominee
from .pods import PodInfo
from .waiters import Refused, Waiting

__all__ = ["Nudger", "retry_stamp"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

PER_ROUND = 16
"""Pods nudged per capacity event: a freed server can take one pod in server granularity, a
few in card granularity; more would only have kube-scheduler refuse them again."""
PER_SECOND = 50.0
"""Upper bound on nudge patches per second, so a flapping fleet cannot flood the apiserver."""
RETRY_SECONDS = 0.2
"""Wait before retrying a nudge the apiserver failed without saying how long to wait."""
RETRY_LIMIT = 2.0
"""Longest wait before retrying failed nudges, whatever ``Retry-After`` asked: each second
the nudge waits the freed capacity idles."""


def _given(value: float | None) -> tuple[float, ...]:
    return () if value is None else (value,)


def retry_stamp(now: float) -> str:
    """A value that changes on every nudge (RFC 3339 with microseconds)."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Nudger:
    """Annotates refused and waiting pods when capacity appears, while ``leading()``; run it
    in the lifespan's task group."""

    __slots__ = (
        "_api",
        "_clock",
        "_count",
        "_held",
        "_leading",
        "_nominees",
        "_pending",
        "_refused",
        "_retry_at",
        "_waiting",
        "_wake",
    )

    def __init__(
        self,
        api: KubeApi,
        refused: Refused,
        *,
        clock: Callable[[], float],
        count: Callable[[], None],
        waiting: Waiting | None = None,
        leading: Callable[[], bool] = lambda: True,
        held: Callable[[PodUID], bool] = lambda uid: False,
        nominees: Callable[[], Mapping[PodUID, Nominee]] = dict,
    ) -> None:
        self._api = api
        self._nominees = nominees
        self._refused = refused
        self._waiting = Waiting() if waiting is None else waiting
        self._clock = clock
        self._count = count
        self._leading = leading
        self._held = held
        self._pending = False
        self._retry_at: float | None = None
        self._wake: anyio.Event | None = None

    def notify(self) -> None:
        """Capacity appeared; callable from synchronous code (watch handlers)."""
        self._pending = True
        if self._wake is not None:
            self._wake.set()

    def pod_changed(self, before: PodInfo | None, after: PodInfo | None) -> None:
        """Pod watch listener: a nominee that goes away or finishes releases the server
        promised to it, which is capacity for everyone else it kept off."""
        gone = after is None or after.finished
        if before is not None and gone and before.uid in self._nominees():
            self.notify()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Nudge a round of refused pods after each capacity event, forever."""
        task_status.started()
        while True:
            if not self._pending:
                await self._rest()
            if not self._leading():
                # A follower keeps the event pending: the round runs when it takes over,
                # since capacity may have appeared while the old leader was dying.
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            self._pending = False
            await self.nudge_round()

    async def _rest(self) -> None:
        """Until a capacity event, a nomination's expiry (the server promised to a pod that
        never booked it is free again), or until a round that found every waiting pod in
        its cool-down can run: the capacity it was for is still unused."""
        self._wake = anyio.Event()
        expiries = (n.expires_at for n in self._nominees().values())
        wake_at = min((*expiries, *_given(self._retry_at)), default=math.inf)
        delay = max(0.0, wake_at - self._clock())
        with anyio.move_on_after(delay):
            await self._wake.wait()
        self._pending = True

    def leadership(self, leading: bool) -> None:
        """Election listener: a new leader nudges a round at once."""
        if leading:
            self.notify()

    async def nudge_round(self) -> None:
        """Nudge up to ``PER_ROUND`` pods, at most ``PER_SECOND``: nominees whose promised
        cards are free, then the oldest this replica refused, then the least recently nudged
        of the others waiting."""
        pods = self._pick(self._clock())
        if not pods:
            return
        with tracer.start_as_current_span("nudge", attributes={"rgpu.pods": len(pods)}):
            waits = await self._send(pods)
        if waits:
            self._retry_at = self._clock() + min(max(waits), RETRY_LIMIT)

    def _pick(self, now: float) -> list[PodRef]:
        """This round's pods, each marked nudged; when there is none, notes when a round may
        find one (every waiting pod is cooling down)."""
        nominees = self._nominees()
        freed = frozenset(uid for uid, n in nominees.items() if n.freed)
        # A nominee whose victims still hold its cards books nothing (its server or none):
        # nudging it would only cost kube-scheduler a cycle ahead of everyone below it.
        # Once they are gone it goes first, whichever replica refused it: a round of others
        # the leader refused must not push back the pod its victims left for.
        pods = self._waiting.take(
            PER_ROUND, now, lambda uid: uid not in freed or self._held(uid), first=freed
        )
        taken = {pod.uid for pod in pods}
        for pod in self._refused.take(PER_ROUND - len(pods)):
            if pod.uid not in taken and pod.uid not in nominees:
                pods.append(pod)
                self._waiting.nudged(pod.uid, now)
        mine = {pod.uid for pod in pods}
        pods += self._waiting.take(
            PER_ROUND - len(pods),
            now,
            lambda uid: uid in mine or uid in nominees or self._held(uid),
        )
        unready = nominees.keys() - freed
        self._retry_at = (
            None
            if pods
            else self._waiting.cooled_at(now, lambda uid: uid in unready or self._held(uid))
        )
        return pods

    async def _send(self, pods: list[PodRef]) -> list[float]:
        """Nudge ``pods`` in turn, at most ``PER_SECOND``; the waits the apiserver asked for
        on retryable failures."""
        waits = []
        for pod in pods:
            wait = await self._nudge(pod)
            if wait is not None:
                # The capacity this round was for is still unused: the pod goes first in the
                # next round, which runs once the apiserver asked us to wait.
                self._refused.remember(pod, first=True)
                waits.append(wait)
            await anyio.sleep(1.0 / PER_SECOND)
        return waits

    async def _nudge(self, pod: PodRef) -> float | None:
        """Annotate ``pod``; seconds to wait before trying again when the apiserver failed
        in a way worth retrying (429, 5xx, timeouts), else ``None``."""
        stamp = retry_stamp(self._clock())
        try:
            await self._api.annotate_pod(pod.namespace, pod.name, {ANNOTATION_RETRY_AT: stamp})
        except KubeNotFound:
            return None
        except KubeError as exc:
            logger.warning("could not nudge pod %s: %s", pod.key, exc)
            return (exc.retry_after or RETRY_SECONDS) if exc.retryable else None
        self._count()
        return None
