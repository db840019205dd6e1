"""Watch events can be missed (a replica restarts, a watch is cut, a
booking simply lapses without any event), so every replica also sweeps periodically: invalid
claims are removed, claims whose pod the cache cannot see are checked with a fresh read, and
pods with duplicate, unbound-marked or missing claims are queued for reconciliation.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskStatus
from opentelemetry import trace

from rgpu_contracts import ClaimState
from rgpu_placement import Validity
from rgpu_runtime import RgpuError

from .core import Core
from .leases import LeaseRecord
from .reconciling import Reconciler
from .repairing import Repairer
from .revalidating import confirmed_invalid
from .settling import drop_invalid

__all__ = ["Sweeper", "sweep_interval"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

FRESH_READS = 100
"""Pods read from the apiserver per sweep to confirm claims the cache cannot judge."""


def sweep_interval(ttl: float) -> float:
    """A third of the booking TTL (a lapsed booking lingers at most that much longer),
    between 0.2 s and 10 s."""
    return max(0.2, min(ttl / 3.0, 10.0))


class Sweeper:
    """Periodically removes invalid claims and queues pods whose claims need care."""

    __slots__ = ("_core", "_interval", "_reconciler", "_repairer")

    def __init__(self, core: Core, reconciler: Reconciler, repairer: Repairer) -> None:
        self._core = core
        self._reconciler = reconciler
        self._repairer = repairer
        self._interval = sweep_interval(core.policy.ttl)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``sweep_interval`` forever."""
        task_status.started()
        while True:
            await anyio.sleep(self._interval)
            await self.sweep_once()

    async def sweep_once(self) -> None:
        """One pass over every claim Lease and every pod that may need repair."""
        with tracer.start_as_current_span("sweep"):
            budget = FRESH_READS
            for record in self._core.ledger.leases():
                try:
                    budget = await self._sweep_lease(record, budget)
                except RgpuError as exc:
                    logger.warning("sweep of %s failed: %s", record.name, exc)
            self._queue_pods()

    async def _sweep_lease(self, record: LeaseRecord, budget: int) -> int:
        core = self._core
        verdicts = [(c, core.validity(c)) for c in record.claims]
        unknown = [c for c, v in verdicts if v is Validity.UNKNOWN][: max(budget, 0)]
        confirmed = [c.pod.uid for c in unknown if await confirmed_invalid(core, c)]
        if confirmed or any(v is Validity.INVALID for _, v in verdicts):
            await drop_invalid(core, record.server, confirmed)
        return budget - len(unknown)

    def _queue_pods(self) -> None:
        core = self._core
        for uid in core.ledger.duplicated_pods():
            self._reconciler.enqueue(uid)
        for record in core.ledger.leases():
            for claim in record.claims:
                pod = core.pods.get(claim.pod.uid)
                if claim.state is not ClaimState.BOUND and pod is not None and pod.bound:
                    self._reconciler.enqueue(claim.pod.uid)
        for pod in core.pods:
            if self._repairer.needed(pod):
                self._reconciler.enqueue(pod.uid)
