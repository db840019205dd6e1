"""Kube-scheduler's PriorityQueue decides *when* a refused pod is tried
again, and rgpu's wake-up design (validate before refusing, nudge on release) only makes sense
against those exact rules: activeQ ordered by priority then age, backoffQ with a per-pod backoff
that doubles per attempt up to a cap, unschedulable pods that wait for a cluster event or a
periodic flush, and the in-flight rule that turns a move request received during an attempt into
a backoff instead of a lost wake-up. Keeping the queue apart from the HTTP side lets it be tested
with a fake clock.

Since Kubernetes 1.33 the ``SchedulerPopFromBackoffQ`` feature gate (beta, on by default) changes
two of those rules, and ``pop_from_backoff`` follows it: an idle scheduler (activeQ empty) takes
the next pod from backoffQ instead of waiting out its backoff (never one that failed with an
error: those keep their full backoff), and backoff ends on whole-second ordering windows. It is
off by default: rgpu deploys kube-scheduler v1.31, which has neither rule.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

__all__ = ["ORDERING_WINDOW", "SchedulingQueue"]

ORDERING_WINDOW = 1.0
"""kube-scheduler's ``backoffQOrderingWindowDuration``: with ``pop_from_backoff`` a backoff
ends at the start of the window after the one its expiry falls in."""

_Entry = tuple[Any, ...]
"""A heap entry: sort keys first, then the pod's ticket and uid."""

_ACTIVE, _BACKOFF, _UNSCHEDULABLE, _IN_FLIGHT, _ASSUMED = (
    "active",
    "backoff",
    "unschedulable",
    "in-flight",
    "assumed",
)


@dataclass(slots=True, kw_only=True)
class _Queued:
    uid: str
    priority: int
    state: str
    since: float
    """When the pod entered its current queue; a failure time is the base of its backoff."""
    attempts: int = 0
    moved: bool = False
    """A move request arrived while the pod was in flight."""
    ticket: int = 0
    """Identifies the heap entry that is current; older entries are skipped when popped."""


class SchedulingQueue:
    """kube-scheduler's PriorityQueue: activeQ, backoffQ and the unschedulable pods.

    Single-threaded (one event loop); every method is O(log n) except ``move_all``, which is
    linear in the unschedulable pods, as kube-scheduler's is. ``clock`` is injectable so the
    rules can be checked without sleeping.
    """

    def __init__(
        self,
        *,
        initial_backoff: float,
        max_backoff: float,
        flush_after: float,
        pop_from_backoff: bool = False,
        window: float = ORDERING_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.flush_after = flush_after
        self.pop_from_backoff = pop_from_backoff
        self.window = window
        self.clock = clock
        self._pods: dict[str, _Queued] = {}
        self._active: list[_Entry] = []
        # Pods that were unschedulable (an idle scheduler may take them early), by due time,
        # then as activeQ orders them; and pods that failed with an error, by due time.
        self._backoff: list[_Entry] = []
        self._errors: list[_Entry] = []
        # Insertion order is age order, so the flush only ever looks at the front.
        self._unschedulable: dict[str, None] = {}
        self._in_flight: set[str] = set()
        self._tickets = itertools.count(1)
        self._changed = anyio.Event()

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def state(self, uid: str) -> str | None:
        """``active``, ``backoff``, ``unschedulable``, ``in-flight``, ``assumed`` or ``None``."""
        pod = self._pods.get(uid)
        return None if pod is None else pod.state

    def backoff_seconds(self, attempts: int) -> float:
        """``initial * 2**(attempts-1)``, capped (kube's ``calculateBackoffDuration``)."""
        return min(self.initial_backoff * 2.0 ** max(attempts - 1, 0), self.max_backoff)

    def add(self, uid: str, priority: int = 0) -> None:
        """A new pending pod enters activeQ; known pods are left where they are."""
        if uid not in self._pods:
            pod = _Queued(uid=uid, priority=priority, state=_ACTIVE, since=self.clock())
            self._pods[uid] = pod
            self._to_active(pod)

    def pop(self) -> str | None:
        """The next pod to schedule (highest priority, then oldest), now in flight; with
        ``pop_from_backoff`` and nothing active, the first unschedulable pod in backoff."""
        self._release(self.clock())
        pod = self._take(self._active, _ACTIVE)
        if pod is None and self.pop_from_backoff:
            pod = self._take(self._backoff, _BACKOFF)
        if pod is None:
            return None
        pod.state, pod.moved = _IN_FLIGHT, False
        pod.attempts += 1
        self._in_flight.add(pod.uid)
        return pod.uid

    def _take(self, heap: list[_Entry], state: str) -> _Queued | None:
        """The first pod of ``heap`` still in ``state`` under that entry's ticket."""
        while heap:
            pod = self._current(heapq.heappop(heap), state)
            if pod is not None:
                return pod
        return None

    def _current(self, entry: _Entry, state: str) -> _Queued | None:
        """The pod of ``entry`` if the entry is still its place in a ``state`` queue."""
        *_, ticket, uid = entry
        pod = self._pods.get(uid)
        return pod if pod is not None and pod.state == state and pod.ticket == ticket else None

    def assume(self, uid: str) -> None:
        """The pod's scheduling cycle chose a node; it waits for its binding cycle."""
        pod = self._pods.get(uid)
        if pod is not None and pod.state == _IN_FLIGHT:
            pod.state = _ASSUMED
            self._in_flight.discard(uid)

    def failed(self, uid: str, *, unschedulable: bool) -> None:
        """The attempt failed: unschedulable pods wait for a move, errors go to backoffQ."""
        pod = self._pods.get(uid)
        if pod is None or pod.state not in (_IN_FLIGHT, _ASSUMED):
            return
        self._in_flight.discard(uid)
        pod.since = self.clock()
        if unschedulable and not pod.moved:
            pod.state = _UNSCHEDULABLE
            self._unschedulable[uid] = None
            self._changed.set()
        else:
            self._to_backoff(pod, self._due(pod), error=not unschedulable)

    def updated(self, uid: str) -> None:
        """The pending pod itself changed: retry it if it was waiting for a change."""
        pod = self._pods.get(uid)
        if pod is not None and pod.state == _UNSCHEDULABLE:
            self._requeue(pod, self.clock())
        elif pod is not None and pod.state == _IN_FLIGHT:
            pod.moved = True

    def parked(self) -> tuple[str, ...]:
        """The unschedulable pods, which the next ``move_all`` sends back."""
        return tuple(self._unschedulable)

    def move_all(self) -> int:
        """A cluster event: every unschedulable pod goes back (serving its backoff first)."""
        now = self.clock()
        moved = [self._pods[uid] for uid in self._unschedulable]
        for pod in moved:
            self._requeue(pod, now)
        for uid in self._in_flight:
            self._pods[uid].moved = True
        return len(moved)

    def forget(self, uid: str) -> None:
        """The pod was bound, deleted or handed elsewhere: drop it from every queue."""
        if self._pods.pop(uid, None) is not None:
            self._unschedulable.pop(uid, None)
            self._in_flight.discard(uid)

    def next_due(self) -> float | None:
        """When a pod in backoffQ or the unschedulable pods next becomes due (clock time)."""
        dues = [heap[0][0] for heap in (self._backoff, self._errors) if heap]
        if self._unschedulable:
            dues.append(self._pods[next(iter(self._unschedulable))].since + self.flush_after)
        return min(dues) if dues else None

    async def wait(self) -> None:
        """Sleep until a pod may be ready: something changed, or the next due time came."""
        due = self.next_due()
        self._changed = anyio.Event()
        delay = math.inf if due is None else max(due - self.clock(), 0.0)
        with anyio.move_on_after(delay):
            await self._changed.wait()

    def _release(self, now: float) -> None:
        for heap in (self._backoff, self._errors):
            # One entry at a time: a stale entry that is due says nothing of the next one.
            while heap and heap[0][0] <= now:
                pod = self._current(heapq.heappop(heap), _BACKOFF)
                if pod is not None:
                    self._to_active(pod)
        while self._unschedulable:
            pod = self._pods[next(iter(self._unschedulable))]
            # The same sum as next_due, so a wake-up at that time always finds the pod due.
            if pod.since + self.flush_after > now:
                break
            self._requeue(pod, now)

    def _due(self, pod: _Queued) -> float:
        """When ``pod``'s backoff ends: its expiry, or with ``pop_from_backoff`` the start of
        the ordering window after the expiry's (kube compares truncated times)."""
        expiry = pod.since + self.backoff_seconds(pod.attempts)
        if not self.pop_from_backoff:
            return expiry
        return (math.floor(expiry / self.window) + 1) * self.window

    def _requeue(self, pod: _Queued, now: float) -> None:
        self._unschedulable.pop(pod.uid, None)
        due = self._due(pod)
        if due > now:
            self._to_backoff(pod, due, error=False)
        else:
            self._to_active(pod)

    def _to_active(self, pod: _Queued) -> None:
        pod.state, pod.ticket = _ACTIVE, next(self._tickets)
        heapq.heappush(self._active, (-pod.priority, pod.since, pod.ticket, pod.uid))
        self._changed.set()

    def _to_backoff(self, pod: _Queued, due: float, *, error: bool) -> None:
        pod.state, pod.ticket = _BACKOFF, next(self._tickets)
        if error:
            heapq.heappush(self._errors, (due, pod.ticket, pod.uid))
        else:
            heapq.heappush(self._backoff, (due, -pod.priority, pod.since, pod.ticket, pod.uid))
        self._changed.set()
