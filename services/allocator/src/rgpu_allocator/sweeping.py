"""Claims must follow their pods: a pod deleted, finished or bound, a Lease vanished, a pod
holding two claims. Two activities keep them in line.

The ``Reconciler``: watch events say *that* something about a pod's claims may need doing, but
writing to the apiserver from inside a watch loop would stall every event behind one slow
call. So watches only enqueue the pod uid, and this worker brings that pod's claims in line
with the rules, one pod at a time, each decided again on fresh Lease reads.

The ``Sweeper``: watch events can be missed (a replica restarts, a watch is cut, a booking
simply lapses without any event), so the claims are also swept periodically: invalid claims
are removed, claims whose pod the cache cannot see are checked with a fresh read, and pods
with duplicate, unbound-marked or missing claims are queued for reconciliation.

Both write to the apiserver on their own initiative, so with several replicas only the elected
one does either (``rgpu_runtime.replicas.Election``), or every replica would write the same fix: the
apiserver's background writes would grow with the replica count, and all but one would lose
the compare-and-swap. Decisions stay active-active; a follower only watches. A follower's
queue is empty, so nothing it saw is lost at a handover: the new leader sweeps at once, which
finds every invalid claim and queues every pod whose claims need care.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskStatus
from opentelemetry import trace

from rgpu_contracts import ClaimState, NodeName, PodUID
from rgpu_placement import Validity, winner
from rgpu_runtime.errors import KubeError, RgpuError

from .claims import LeaseRecord
from .clients import KubeApi
from .judging import Judge
from .leases import Edited, LeaseWriter
from .pods import PodInfo
from .removal import Remover, read_pod
from .repair import Repairer
from .waiters import Refused, Waiting

__all__ = ["Reconciler", "Sweeper", "mark_bound", "sweep_interval"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

QUEUED = 100_000
"""Pods waiting for reconciliation; a mass deletion beyond that is finished by the sweep."""
FRESH_READS = 100
"""Pods read from the apiserver per sweep to confirm claims the cache cannot judge."""


def sweep_interval(ttl: float) -> float:
    """A third of the booking TTL (a lapsed booking lingers at most that much longer),
    between 0.2 s and 10 s."""
    return max(0.2, min(ttl / 3.0, 10.0))


async def mark_bound(writer: LeaseWriter, server: str, uid: str, node: str) -> None:
    """Record on the Lease that ``uid`` is bound to ``node`` (for ``kubectl`` and metrics)."""

    def change(record: LeaseRecord | None) -> Edited[None]:
        claim = record.claim_of(uid) if record is not None else None
        if record is None or claim is None or claim.state is ClaimState.BOUND:
            return Edited(None, None)
        bound = dataclasses.replace(claim, state=ClaimState.BOUND, node=NodeName(node))
        return Edited((*record.without(uid), bound), None)

    await writer.edit(server, change, op="bind")


class Reconciler:
    """A queue of pod uids whose claims need a look, and the worker that looks."""

    __slots__ = (
        "_judge",
        "_leading",
        "_pending",
        "_refused",
        "_remover",
        "_repairer",
        "_scheduler",
        "_waiting",
        "_wake",
        "_writer",
    )

    def __init__(
        self,
        judge: Judge,
        writer: LeaseWriter,
        remover: Remover,
        repairer: Repairer,
        refused: Refused,
        *,
        waiting: Waiting | None = None,
        leading: Callable[[], bool] = lambda: True,
        scheduler: str = "rgpu-scheduler",
    ) -> None:
        self._judge = judge
        self._scheduler = scheduler
        self._writer = writer
        self._remover = remover
        self._repairer = repairer
        self._refused = refused
        self._waiting = Waiting() if waiting is None else waiting
        self._leading = leading
        self._pending: OrderedDict[PodUID, None] = OrderedDict()
        self._wake: anyio.Event | None = None

    def leadership(self, leading: bool) -> None:
        """Election listener: a replica that stops leading drops its queue (the next leader
        sweeps at once, finding the same work)."""
        if not leading:
            self._pending.clear()

    def enqueue(self, uid: str) -> None:
        """Ask for ``uid``'s claims to be looked at (while leading); callable from
        synchronous code."""
        if not self._leading():
            return
        if len(self._pending) < QUEUED:
            self._pending[PodUID(uid)] = None
        if self._wake is not None:
            self._wake.set()

    def pod_changed(self, before: PodInfo | None, after: PodInfo | None) -> None:
        """Route a pod watch change: claims to drop, mark bound, or repair; refusals to forget."""
        ledger = self._judge.ledger
        self._track_waiting(before, after)
        if after is None:
            if before is not None:
                self._refused.forget(before.uid)
                if ledger.servers_of(before.uid):
                    self.enqueue(before.uid)
            return
        if after.bound or after.finished:
            self._refused.forget(after.uid)
        held = ledger.servers_of(after.uid)
        newly_bound = after.bound and not (before is not None and before.bound)
        if (held and (after.finished or newly_bound)) or (
            not held and self._repairer.needed(after)
        ):
            self.enqueue(after.uid)

    def _track_waiting(self, before: PodInfo | None, after: PodInfo | None) -> None:
        pod = after or before
        # schedulerName is immutable: another scheduler's pod never waits for us (most pods).
        if pod is not None and pod.scheduler_name == self._scheduler:
            # A gated pod is not in kube-scheduler's queue: a nudge would move nothing.
            waiting = after is not None and not (after.bound or after.finished or after.gated)
            self._waiting.track(pod.ref, waiting)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Work through the queue forever."""
        task_status.started()
        while True:
            if not self._pending:
                self._wake = anyio.Event()
                await self._wake.wait()
            uid, _ = self._pending.popitem(last=False)
            try:
                await self.reconcile(uid)
            except RgpuError as exc:
                # The periodic sweep looks at every claim again; nothing is lost by moving on.
                logger.warning("could not reconcile pod uid %s: %s", uid, exc)

    async def reconcile(self, uid: str) -> None:
        """Drop ``uid``'s invalid claims, settle duplicates, mark bound, repair if missing."""
        judge = self._judge
        for claim in judge.ledger.claims_of(uid):
            if judge.validity(claim) is Validity.INVALID:
                await self._remover.drop_invalid(claim.server)
        if judge.ledger.servers_of(uid) > 1:
            await self._remover.settle(uid)
        pod = judge.pods.get(uid)
        if pod is None:
            return
        kept = winner(judge.live(uid))
        if kept is not None and pod.node_name and kept.state is not ClaimState.BOUND:
            await mark_bound(self._writer, kept.server, uid, pod.node_name)
        elif kept is None and self._repairer.needed(pod):
            await self._repair(uid)

    async def _repair(self, uid: str) -> None:
        pod = self._judge.pods.get(uid)
        if pod is not None:
            try:
                await self._repairer.repair(pod)
            except KubeError as exc:
                logger.warning("could not repair the claim of %s: %s", pod.ref.key, exc)


class Sweeper:
    """Periodically removes invalid claims and queues pods whose claims need care, while
    this replica leads (at once when it starts to)."""

    __slots__ = (
        "_api",
        "_interval",
        "_judge",
        "_reconciler",
        "_remover",
        "_repairer",
        "_until_leading",
    )

    def __init__(
        self,
        judge: Judge,
        api: KubeApi,
        remover: Remover,
        reconciler: Reconciler,
        repairer: Repairer,
        *,
        until_leading: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._judge = judge
        self._api = api
        self._remover = remover
        self._reconciler = reconciler
        self._repairer = repairer
        self._interval = sweep_interval(judge.ttl)
        self._until_leading = until_leading

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``sweep_interval`` while leading, forever; a replica that starts to
        lead sweeps at once (what its predecessor may have left undone)."""
        task_status.started()
        while True:
            if self._until_leading is None:
                await anyio.sleep(self._interval)
            else:
                await self._until_leading()
            await self.sweep_once()
            if self._until_leading is not None:
                await anyio.sleep(self._interval)

    async def sweep_once(self) -> None:
        """One pass over every claim Lease and every pod that may need repair."""
        with tracer.start_as_current_span("sweep"):
            budget = FRESH_READS
            for record in self._judge.ledger.leases():
                try:
                    budget = await self._sweep_lease(record, budget)
                except RgpuError as exc:
                    logger.warning("sweep of %s failed: %s", record.name, exc)
            self._queue_pods()

    async def _sweep_lease(self, record: LeaseRecord, budget: int) -> int:
        verdicts = [(c, self._judge.validity(c)) for c in record.claims]
        unknown = [c for c, v in verdicts if v is Validity.UNKNOWN][: max(budget, 0)]
        seen = {c.pod.uid: await read_pod(self._api, c) for c in unknown}
        confirmed = any(self._judge.validity(c, seen) is Validity.INVALID for c in unknown)
        if confirmed or any(v is Validity.INVALID for _, v in verdicts):
            # Judged again on the Lease as written: a claim committed since this look stays.
            await self._remover.drop_invalid(record.server, seen)
        return budget - len(unknown)

    def _queue_pods(self) -> None:
        judge = self._judge
        for uid in judge.ledger.duplicated_pods():
            self._reconciler.enqueue(uid)
        for record in judge.ledger.leases():
            for claim in record.claims:
                pod = judge.pods.get(claim.pod.uid)
                if claim.state is not ClaimState.BOUND and pod is not None and pod.bound:
                    self._reconciler.enqueue(claim.pod.uid)
        for pod in judge.pods:
            if self._repairer.needed(pod):
                self._reconciler.enqueue(pod.uid)
