"""Booking on the filter path (HAMi's flow, and pods that were never gated): ``POST
/v1/allocations`` chooses a server for a pod and books it durably, ``DELETE`` releases it
(``committing`` turns a booking into the Binding's annotations). The rules, top-down:

* idempotent per pod uid: a pod holding a valid claim gets that claim back;
* each round decides on one value, what it saw (``deciding.Seen``); the booking is a
  compare-and-swap on the chosen server's Lease that re-checks the fit on the Lease as the
  apiserver holds it (``booker``); losing the race means another round;
* a refusal is not stale and may free a server (``refusing``: fresh looks at the blockers,
  preemption); while a nomination stands the pod books that server or nothing, and the
  booking clears the nomination in the same compare-and-swap;
* replicas racing on the same pod settle on one server (``Remover.settle``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from opentelemetry import trace

from rgpu_contracts import Allocation, AllocationRequest, NoFit
from rgpu_placement import (
    Demand,
    FleetView,
    Refusal,
    demand_of,
    winner,
)
from rgpu_runtime.pacing import KeyedLocks
from rgpu_runtime.telemetry import pod_attributes

from .answers import Answers
from .booker import Booked, Booker
from .clients import KubeApi
from .deciding import Decider, Seen
from .errors import ClaimNotFound, Contended, NotSynced, StillRunning
from .judging import Judge
from .occupancy import Occupancy
from .refusing import Again, Checks, Refusals
from .removal import Remover, read_pod

__all__ = ["ROUNDS", "Booking"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

ROUNDS = 10
"""Decide-and-book rounds per request: each lost round means another replica just took the
server, so a few rounds cover any realistic burst before answering "retry"."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Booking:
    """Book, release and look up claims, as the routes call them."""

    judge: Judge
    decider: Decider
    booker: Booker
    remover: Remover
    refusals: Refusals
    checks: Checks
    """The fresh looks a refusal may take (each request starts with all of them)."""
    answers: Answers
    api: KubeApi
    pod_locks: KeyedLocks = field(default_factory=KeyedLocks)
    """Requests for one pod go one at a time in a replica (the second finds the first's claim)."""

    async def allocate(self, request: AllocationRequest) -> Allocation | NoFit:
        """Choose and (unless ``dry_run``) book a server for ``request.pod``.

        Returns the ``Allocation`` or, when nothing fits, a ``NoFit`` with HAMi's reasons. Raises
        ``FleetUnknown``/``NotSynced`` before the inputs are in, ``Contended`` after ``ROUNDS``
        lost races, and ``KubeUnavailable`` when the apiserver is away.
        """
        view = self.judge.view()
        self._require_synced()
        pod = request.pod
        attributes: dict[str, str | bool] = {
            **pod_attributes(namespace=pod.namespace, name=pod.name, uid=pod.uid),
            "rgpu.dry_run": request.dry_run,
        }
        with tracer.start_as_current_span("allocate", attributes=attributes):
            async with self.pod_locks.hold(request.pod.uid):
                return await self._allocate(request, view)

    async def release(self, uid: str) -> None:
        """Remove every claim of ``uid``; releasing nothing is fine (idempotent).

        A release is a removal, so it is judged like one, on the pod as the apiserver holds it
        now: a claim whose pod is bound and not finished stays (``StillRunning``), whoever
        asks; the extender's own releases follow a Binding that failed, for a pod still unbound.
        """
        for claim in self.judge.ledger.claims_of(uid):
            pod = await read_pod(self.api, claim)
            if pod is not None and pod.bound and not pod.finished:
                raise StillRunning(
                    f"{claim.pod.key} is bound to {pod.node_name} and {pod.phase.lower()}; its "
                    f"claim on {claim.server} is released when the pod ends: delete the pod"
                )
        await self.remover.release(uid)
        self.refusals.refused.forget(uid)

    def lookup(self, uid: str) -> Allocation:
        """The pod's current allocation; raises ``ClaimNotFound`` when it holds no valid claim."""
        claim = winner(self.judge.live(uid))
        if claim is None:
            raise ClaimNotFound(f"no valid claim for pod uid {uid}")
        return self.answers.allocation_of(claim)

    def _require_synced(self) -> None:
        """Raises ``NotSynced`` until pods and Leases have been listed once."""
        if not (self.judge.pods.synced and self.judge.ledger.synced):
            raise NotSynced("pods and claim Leases are still being listed; retry shortly")

    async def _allocate(self, request: AllocationRequest, view: FleetView) -> Allocation | NoFit:
        held = await self._held(request)
        if held is not None:
            return held
        demand = demand_of(request.containers, cuda_major=request.cuda_major)
        checks = self.checks
        # Fresh reads and re-probes happen at most once per request; later rounds decide on what
        # they found (a re-probed view stays in use: it is fresher than the cached fleet for them).
        for _ in range(ROUNDS):
            seen = self._see(request, demand, view)
            answer = await self._round(request, seen, checks)
            if not isinstance(answer, Again):
                return answer
            checks = checks.after(answer)
            view = answer.fresh if answer.fresh is not None else view
        raise Contended(f"could not book a server for {request.pod.key}: every choice was taken")

    async def _held(self, request: AllocationRequest) -> Allocation | None:
        claim = winner(self.judge.live(request.pod.uid))
        if claim is None:
            return None
        if not request.dry_run and self.judge.ledger.servers_of(request.pod.uid) > 1:
            claim = await self.remover.settle(request.pod.uid) or claim
        self.refusals.instruments.decisions.labels("reused", "").inc()
        self.refusals.refused.forget(request.pod.uid)
        return self.answers.allocation_of(claim)

    def _see(self, request: AllocationRequest, demand: Demand, view: FleetView) -> Seen:
        """What this round decides on, computed once."""
        uid = request.pod.uid
        held = self.judge.occupancy(uid)
        return Seen(
            pod=request.pod,
            demand=demand,
            view=view,
            held=held,
            nominated=self.judge.nominated_on(uid, view, held),
            candidates=request.candidate_nodes,
        )

    async def _round(
        self, request: AllocationRequest, seen: Seen, checks: Checks
    ) -> Allocation | NoFit | Again:
        outcome = self.decider.decide(seen)
        if isinstance(outcome, Refusal):
            return await self.refusals.handle(request, seen, outcome, checks)
        booked = Booked(
            pod=request.pod,
            containers=request.containers,
            demand=seen.demand,
            choice=outcome,
            seen=seen.held if isinstance(seen.held, Occupancy) else None,
        )
        if request.dry_run:
            self.refusals.instruments.decisions.labels("dry_run", "").inc()
            claim = self.booker.claim(booked, outcome, self.judge.clock())
            return self.answers.allocation_of(claim)
        return await self._book(booked)

    async def _book(self, booked: Booked) -> Allocation | Again:
        claim = await self.booker.book(booked)
        if claim is None:
            return Again()
        kept = claim
        if self.judge.ledger.servers_of(booked.pod.uid) > 1:
            kept = await self.remover.settle(booked.pod.uid) or claim
        self.refusals.instruments.decisions.labels("allocated", "").inc()
        self.refusals.refused.forget(booked.pod.uid)
        logger.info("booked %s for pod %s", kept.server, booked.pod.key)
        return self.answers.allocation_of(kept)
