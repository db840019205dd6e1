"""kube-scheduler decides one pod per serial cycle, so booking inside its ``/filter`` puts an
apiserver write on every cycle and sends pods no server can take round and round its queues.
With admission by scheduling gate, a GPU pod reaches kube-scheduler only once a server is
booked for it: the elected allocator walks the gated pods in queue order (``planning``), books
servers for many of them at once (bounded), and lifts only rgpu's gate, against the pod's
``resourceVersion`` (``gates``). kube-scheduler then finds the booking and places the pod.

A gang's bookings are all written before any of its gates is lifted, and if one write fails
the others are released: a gang never runs in part.

Nothing is remembered that the apiserver does not hold: the queue is the gated pods the pod
watch delivers, a booking is a claim in a Lease, so a new leader rebuilds everything (a pod
booked but still gated just has its gate lifted) and a failover loses nothing.

Waiting costs nothing: a pass happens when something changed (a gated pod arrived, capacity
freed, the fleet or the queue configuration changed, leadership moved) and at a slow period
for what time alone changes; gated pods are never nudged. Each pod's reason to wait is
announced once per change of reason, as an Event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import anyio
from anyio.abc import TaskGroup, TaskStatus
from opentelemetry import trace
from opentelemetry.trace import SpanContext
from prometheus_client.core import Metric

from rgpu_contracts import AdmissionQueue, Claim, PodUID
from rgpu_placement import FleetView
from rgpu_runtime.errors import RgpuError
from rgpu_runtime.telemetry import creation_context, link_creation, pod_span

from .admission_preempting import Preempting
from .admission_writes import UnitWrites
from .booker import Booker
from .clients import KubeApi, pod_event
from .instruments import Instruments
from .judging import Judge
from .planning import Planner
from .pods import PodInfo
from .preempting import Preemptor
from .queueing import in_order
from .queues import Queues
from .queueview import QueueEntry, admission_queue
from .removal import Remover
from .retries import Retries
from .verdicts import Verdict, Wait
from .waits import Waits, busy_in, gauges

__all__ = ["PERIOD", "Admitter"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

PERIOD = 2.0
"""Seconds between passes when nothing wakes the admitter: what only time changes (a booking
lapsing, a nomination expiring) is looked at this often."""
LAPSED = "RemoteGPUAdmissionLapsed"
"""The Event reason saying an admitted pod's booking lapsed before it was bound."""


class Admitter:
    """The admission loop; runs in every replica, acts only while ``leading()``."""

    def __init__(
        self,
        *,
        planner: Planner,
        booker: Booker,
        remover: Remover,
        preemptor: Preemptor,
        queues: Queues,
        api: KubeApi,
        instruments: Instruments,
        concurrency: int,
        ahead: int,
        leading: Callable[[], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._planner, self._booker = planner, booker
        self._ahead = ahead
        self._queues = queues
        self._api, self._instruments = api, instruments
        self._concurrency, self._leading, self._clock = concurrency, leading, clock
        self._queue: dict[PodUID, PodInfo] = {}
        self._arrival: dict[str, int] = {}
        self._arrivals = 0
        self._flight: set[str] = set()
        # Lifted, but the pod watch has not delivered the pod without its gate yet: another
        # pass must not lift it again.
        self._lifted: set[str] = set()
        self._preempting = Preempting(preemptor, notify=self.notify, admitting=self._admitting)
        self._retries = Retries(clock)
        self._waits = Waits(api)
        self._writes = UnitWrites(
            booker=booker,
            remover=remover,
            judge=planner.judge,
            api=api,
            instruments=instruments,
            retries=self._retries,
            waits=self._waits,
            lifted=self._lifted,
            clock=clock,
        )
        self._due = True
        self._wake: anyio.Event | None = None

    @property
    def judge(self) -> Judge:
        return self._planner.judge

    def __len__(self) -> int:
        return len(self._queue)

    def notify(self) -> None:
        """Something that may let a pod in changed (capacity freed, fleet, queues);
        sync-callable."""
        self._due = True
        if self._wake is not None:
            self._wake.set()

    def pod_changed(self, before: PodInfo | None, after: PodInfo | None) -> None:
        """Pod watch listener: keep the queue of pods waiting for rgpu's admission."""
        if after is not None and after.admissible:
            if self._queue.get(after.uid) != after:
                if after.uid not in self._queue:
                    self._arrivals += 1
                    self._arrival[after.uid] = self._arrivals
                self._queue[after.uid] = after
                self.notify()
            return
        if after is not None and after.bound and before is not None and not before.bound:
            # A pod left kube-scheduler's queue: admission may be a pod further ahead again.
            self.notify()
        gone = after or before
        if gone is not None and self._queue.pop(gone.uid, None) is not None:
            self._waits.forget(gone.uid)
            self._lifted.discard(gone.uid)
            self._retries.forget(gone.uid)
            self._arrival.pop(gone.uid, None)

    def lapsed(self, claim: Claim) -> None:
        """An admitted booking lapsed unbound (removed by the sweep): say so on the pod."""
        self._instruments.admissions.labels("lapsed").inc()
        message = (
            f"the booking of server {claim.server} made at admission lapsed before the pod "
            "was bound; kube-scheduler's filter books a server for it now"
        )
        self._api.record_event(pod_event(claim.pod, reason=LAPSED, message=message))

    def leadership(self, leading: bool) -> None:
        """Election listener: a new leader looks at the whole queue at once."""
        if leading:
            self.notify()

    def queue(self) -> AdmissionQueue:
        """Every gated pod in admission order with what a pass decides for it now (a dry
        pass: any replica can answer it), and each namespace's share."""
        view = self.judge.discovery.view
        verdicts = [] if view is None else self._plan(view, limit=len(self._queue) + 1)
        entries = [QueueEntry(pod=v.pod, position=i, verdict=v) for i, v in enumerate(verdicts)]
        return admission_queue(entries, held=self._held(), queues=self._queues)

    def collect(self) -> Iterator[Metric]:
        """The queue's gauges and the namespaces' shares, from the leader only (one series
        set whatever the replicas)."""
        leading = self._leading()
        busy = busy_in(self._flight, self._lifted)
        yield from gauges(self._waits.counts(self._queue, busy) if leading else None)
        yield from self._queues.quotas(self._held(), leading)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Pass after pass, forever; the task group holds the admissions in flight."""
        async with anyio.create_task_group() as tg:
            task_status.started()
            while True:
                if not self._due:
                    self._wake = anyio.Event()
                    # A pod the apiserver failed is tried when its backoff ends, not a
                    # period later: an urgent pod would wait out the rest of the period.
                    with anyio.move_on_after(self._retries.next_in(PERIOD)):
                        await self._wake.wait()
                self._due = False
                if self._leading() and self._ready():
                    self._pass(tg)

    def _ready(self) -> bool:
        judge = self.judge
        return judge.discovery.view is not None and judge.pods.synced and judge.ledger.synced

    def _held(self) -> dict[str, int]:
        """Cards per namespace held or being booked (quotas count both)."""
        held = dict(self.judge.ledger.cards_by_namespace())
        for namespace, cards in self._booker.pending.cards_by_namespace().items():
            held[namespace] = held.get(namespace, 0) + cards
        return held

    def _plan(self, view: FleetView, *, limit: int) -> list[Verdict]:
        pods = in_order(self._queue.values(), self._arrival)
        return self._planner.plan(
            pods,
            view,
            limit=limit,
            config=self._queues.config,
            held=self._held(),
            # A pod whose preemption is under way books nothing meanwhile: the preemption
            # nominates a server only after rehearsing its evictions, and a booking made in
            # between would leave its victims evicted for nothing.
            busy=self._flight | self._lifted | self._preempting.busy() | self._retries.waiting(),
        )

    def _pass(self, tg: TaskGroup) -> None:
        view = self.judge.discovery.view
        room = self._room()
        if view is None or room <= 0 or not self._queue:
            return
        with tracer.start_as_current_span("admission.pass") as span:
            verdicts = self._plan(view, limit=room)
            span.set_attribute("rgpu.queue", len(self._queue))
            admit: dict[object, list[Verdict]] = {}
            for verdict in verdicts:
                if verdict.booked is not None or verdict.held is not None:
                    key = verdict.gang if verdict.gang is not None else verdict.pod.uid
                    admit.setdefault(key, []).append(verdict)
                elif verdict.wait is not Wait.ADMITTING:
                    self._wait(verdict, view, tg)
            for unit in admit.values():
                self._start(unit, tg)

    def _room(self) -> int:
        """Admissions this pass may start: within the concurrency, and no further ahead of
        kube-scheduler than ``ahead`` admitted pods it has not bound."""
        flying = len(self._flight)
        unbound = self.judge.ledger.admitted_unbound()
        return min(self._concurrency - flying, self._ahead - unbound - flying)

    def _start(self, unit: list[Verdict], tg: TaskGroup) -> None:
        for verdict in unit:
            self._flight.add(verdict.pod.uid)
            if verdict.booked is not None:
                self._booker.pending.add(self._tentative(verdict))
        tg.start_soon(self._admit, unit)

    def _tentative(self, verdict: Verdict) -> Claim:
        booked = verdict.booked
        assert booked is not None
        return self._booker.claim(booked, booked.choice, self._clock())

    async def _admit(self, unit: list[Verdict]) -> None:
        first = unit[0].pod
        try:
            with pod_span(tracer, "allocator.admit", first.ref, creation=_creation(first)) as span:
                for other in unit[1:]:
                    link_creation(span, _creation(other.pod))
                span.set_attribute("rgpu.pods", len(unit))
                await self._writes.admit(unit)
        except RgpuError as exc:
            self._retries.failed(v.pod.uid for v in unit)
            logger.warning("could not admit %s: %s", _names(unit), exc)
        finally:
            for verdict in unit:
                if verdict.booked is not None:
                    self._booker.pending.discard(self._tentative(verdict))
                self._flight.discard(verdict.pod.uid)
            self.notify()

    def _wait(self, verdict: Verdict, view: FleetView, tg: TaskGroup) -> None:
        self._waits.announce(verdict)
        self._preempting.start(verdict, view, tg)

    def _admitting(self, uid: str) -> bool:
        """Whether ``uid``'s gate is being lifted, or was and the watch has not said so yet."""
        return uid in self._flight or uid in self._lifted


def _creation(pod: PodInfo) -> SpanContext | None:
    return creation_context(pod.gated.trace) if pod.gated is not None else None


def _names(unit: list[Verdict]) -> str:
    return ", ".join(v.pod.ref.key for v in unit)
