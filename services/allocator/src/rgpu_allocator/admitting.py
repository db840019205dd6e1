"""kube-scheduler decides one pod per serial cycle, so booking inside its ``/filter`` puts an
apiserver write on every cycle and sends pods no server can take round and round its queues.
With admission by scheduling gate, a GPU pod reaches kube-scheduler only once a server is
booked for it: the elected allocator walks the gated pods in queue order (``planning``), books
servers for many of them at once (bounded), and lifts only rgpu's gate, against the pod's
``resourceVersion``. kube-scheduler then finds the booking and just places the pod near it.

Nothing here is remembered that the apiserver does not hold: the queue is the gated pods the
pod watch delivers, a booking is a claim in a Lease, so a new leader rebuilds everything (a pod
booked but still gated just has its gate lifted) and a failover loses nothing.

Waiting costs nothing: a pass happens when something changed (a gated pod arrived, capacity
freed, the fleet changed, leadership moved) and at a slow period for what time alone changes;
shapes refused once in a pass are not decided again; gated pods are never nudged. Each pod's
reason to wait is announced once per change of reason, as an Event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup, TaskStatus
from opentelemetry import trace
from prometheus_client.core import GaugeMetricFamily, Metric

from rgpu_contracts import AdmissionQueue, AllocationRequest, Claim, PodUID, QueuedPod
from rgpu_placement import FleetView, demand_of, gates_after_admission
from rgpu_runtime import KubeConflict, KubeNotFound, RgpuError

from .booker import Booker
from .clients import KubeApi, pod_event
from .instruments import Instruments
from .judging import Judge
from .planning import Planner, Verdict, Wait
from .pods import PodInfo, pod_info
from .preempting import Preemptor, may_preempt
from .queueing import in_order

__all__ = ["PERIOD", "Admitter", "QueueEntry", "admission_queue"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

PERIOD = 2.0
"""Seconds between passes when nothing wakes the admitter: what only time changes (a booking
lapsing, a nomination expiring) is looked at this often."""
LIFT_ATTEMPTS = 4
"""Tries to lift a gate when the pod keeps changing under us (each re-reads it)."""
PREEMPTIONS_AT_ONCE = 4
"""Preemption attempts in flight at once: each is a few apiserver calls (dry runs, budgets)."""
WAITING = "RemoteGPUWaiting"
"""The Event reason saying why a gated pod waits."""
LAPSED = "RemoteGPUAdmissionLapsed"
"""The Event reason saying an admitted pod's booking lapsed before it was bound."""
_WARNINGS = frozenset({Wait.NEVER_FITS, Wait.NO_CLIENT_NODE, Wait.UNREADABLE})


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueEntry:
    """One gated pod as ``GET /v1/queue`` shows it."""

    pod: PodInfo
    position: int
    verdict: Verdict


def admission_queue(entries: list[QueueEntry]) -> AdmissionQueue:
    """The queue as ``GET /v1/queue`` serves it."""
    return AdmissionQueue(pods=tuple(_queued(e) for e in entries))


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


class Admitter:
    """The admission loop; runs in every replica, acts only while ``leading()``."""

    def __init__(
        self,
        *,
        planner: Planner,
        booker: Booker,
        preemptor: Preemptor,
        api: KubeApi,
        instruments: Instruments,
        concurrency: int,
        leading: Callable[[], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._planner, self._booker, self._preemptor = planner, booker, preemptor
        self._api, self._instruments = api, instruments
        self._concurrency, self._leading, self._clock = concurrency, leading, clock
        self._queue: dict[PodUID, PodInfo] = {}
        self._arrival: dict[str, int] = {}
        self._arrivals = 0
        self._flight: set[str] = set()
        # Lifted, but the pod watch has not delivered the pod without its gate yet: another
        # pass must not lift it again.
        self._lifted: set[str] = set()
        self._preempting: set[str] = set()
        self._said: dict[PodUID, Wait] = {}
        self._due = True
        self._wake: anyio.Event | None = None

    @property
    def judge(self) -> Judge:
        return self._planner.judge

    def __len__(self) -> int:
        return len(self._queue)

    def notify(self) -> None:
        """Something that may let a pod in changed (capacity freed, fleet); sync-callable."""
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
        gone = after or before
        if gone is not None and self._queue.pop(gone.uid, None) is not None:
            self._said.pop(gone.uid, None)
            self._lifted.discard(gone.uid)
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

    def queue(self) -> list[QueueEntry]:
        """Every gated pod in admission order with what a pass decides for it now (a dry
        pass: any replica can answer it)."""
        view = self.judge.inputs.view
        pods = in_order(self._queue.values(), self._arrival)
        if view is None:
            return []
        busy = self._flight | self._lifted
        verdicts = self._planner.plan(pods, view, limit=len(pods) + 1, busy=busy)
        return [QueueEntry(pod=v.pod, position=i, verdict=v) for i, v in enumerate(verdicts)]

    def collect(self) -> Iterator[Metric]:
        """``rgpu_admission_queue_pods{reason}``, from the leader only (one series set)."""
        family = GaugeMetricFamily(
            "rgpu_admission_queue_pods",
            "Gated pods waiting for admission, by why they wait (Admitting: in flight).",
            labels=["reason"],
        )
        if self._leading():
            counts = dict.fromkeys(Wait, 0)
            for uid in self._queue:
                busy = uid in self._flight or uid in self._lifted
                reason = Wait.ADMITTING if busy else self._said.get(uid)
                if reason is not None:
                    counts[reason] += 1
            for reason, count in counts.items():
                family.add_metric([reason.value], count)
        yield family

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Pass after pass, forever; the task group holds the admissions in flight."""
        async with anyio.create_task_group() as tg:
            task_status.started()
            while True:
                if not self._due:
                    self._wake = anyio.Event()
                    with anyio.move_on_after(PERIOD):
                        await self._wake.wait()
                self._due = False
                if self._leading() and self._ready():
                    self._pass(tg)

    def _ready(self) -> bool:
        judge = self.judge
        return judge.inputs.view is not None and judge.pods.synced and judge.ledger.synced

    def _pass(self, tg: TaskGroup) -> None:
        view = self.judge.inputs.view
        room = self._concurrency - len(self._flight)
        if view is None or room <= 0 or not self._queue:
            return
        with tracer.start_as_current_span("admission.pass") as span:
            pods = in_order(self._queue.values(), self._arrival)
            busy = self._flight | self._lifted
            verdicts = self._planner.plan(pods, view, limit=room, busy=busy)
            span.set_attribute("rgpu.queue", len(pods))
            for verdict in verdicts:
                self._act(verdict, view, tg)

    def _act(self, verdict: Verdict, view: FleetView, tg: TaskGroup) -> None:
        uid = verdict.pod.uid
        if verdict.booked is not None or verdict.held is not None:
            self._flight.add(uid)
            if verdict.booked is not None:
                tentative = self._booker.claim(verdict.booked, verdict.booked.choice, self._clock())
                self.judge.pending.add(tentative)
            tg.start_soon(self._admit, verdict)
            return
        if verdict.wait is Wait.ADMITTING:
            return
        self._announce(verdict)
        if self._should_preempt(verdict):
            self._preempting.add(uid)
            tg.start_soon(self._preempt, verdict, view)

    async def _admit(self, verdict: Verdict) -> None:
        pod, booked = verdict.pod, verdict.booked
        try:
            with tracer.start_as_current_span("admit", attributes={"k8s.pod.uid": pod.uid}):
                claim = verdict.held if booked is None else await self._booker.book(booked)
                lifted = claim is not None and await self._lift(pod)
                if claim is not None and lifted:
                    self._lifted.add(pod.uid)
                    self._admitted(pod, claim.server)
        except RgpuError as exc:
            logger.warning("could not admit %s: %s", pod.ref.key, exc)
        finally:
            if booked is not None:
                self.judge.pending.discard(self._booker.claim(booked, booked.choice, 0.0))
            self._flight.discard(pod.uid)
            self.notify()

    def _admitted(self, pod: PodInfo, server: str) -> None:
        self._said.pop(pod.uid, None)
        self._instruments.admissions.labels("admitted").inc()
        created = pod.gated.created_at if pod.gated is not None else 0.0
        if created:
            self._instruments.admission_wait_seconds.observe(max(0.0, self._clock() - created))
        logger.info("admitted %s with server %s", pod.ref.key, server)

    async def _lift(self, pod: PodInfo) -> bool:
        """Remove rgpu's gate, against the pod's version; ``False`` when the pod is gone."""
        current: PodInfo | None = pod
        for _ in range(LIFT_ATTEMPTS):
            gated = current.gated if current is not None else None
            if current is None or current.uid != pod.uid:
                return False
            if gated is None:
                return True
            try:
                await self._api.lift_gate(
                    pod.namespace,
                    pod.name,
                    resource_version=gated.resource_version,
                    gates=gates_after_admission(gated.gates),
                )
                return True
            except KubeNotFound:
                return False
            except KubeConflict:
                raw = await self._api.get_pod(pod.namespace, pod.name)
                current = pod_info(raw) if raw is not None else None
        return False

    def _announce(self, verdict: Verdict) -> None:
        uid, wait = verdict.pod.uid, verdict.wait
        if wait is None or self._said.get(uid) is wait:
            return
        self._said[uid] = wait
        message = f"waiting for a remote GPU ({wait.value}): {verdict.message}"
        warning = wait in _WARNINGS
        self._api.record_event(
            pod_event(verdict.pod.ref, reason=WAITING, message=message, warning=warning)
        )

    def _should_preempt(self, verdict: Verdict) -> bool:
        refusal = verdict.refusal
        return (
            verdict.wait is Wait.NO_FIT
            and refusal is not None
            and bool(refusal.blocked_by_claims)
            and may_preempt(verdict.pod)
            and verdict.pod.uid not in self._preempting
            and len(self._preempting) < PREEMPTIONS_AT_ONCE
        )

    async def _preempt(self, verdict: Verdict, view: FleetView) -> None:
        pod, demand = verdict.pod, verdict.demand
        try:
            gated = pod.gated
            if demand is not None and gated is not None:
                request = AllocationRequest(pod=pod.ref, containers=gated.containers)
                await self._preemptor.preempt(request, demand, view)
        finally:
            self._preempting.discard(pod.uid)
            self.notify()
