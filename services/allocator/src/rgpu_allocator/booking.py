"""Booking is the heart of rgpu: ``POST /v1/allocations`` chooses a server for a pod and books
it durably, ``POST /v1/allocations/{uid}/commit`` turns the booking into the Binding's
annotations, ``DELETE`` releases it. The rules are subtle enough to read top-down here:

* idempotent per pod uid: a pod holding a valid claim gets that claim back;
* the choice is made on the cached state, the booking is a compare-and-swap on the chosen
  server's Lease that re-checks the fit on the Lease as the apiserver holds it; losing the
  race means deciding again (another server, or the same one if still free);
* no stale refusal: a refusal caused by claims first re-validates the blockers, and one
  caused only by lupine's busy reports first has discovery probe those servers again;
* a refusal because servers are held lets a pod of priority free one (``preempting``); while
  that nomination stands the pod books that server or nothing, even when another frees first
  (its victims were evicted for it), and the booking clears the nomination in the same
  compare-and-swap;
* replicas racing on the same pod settle on one server (``Remover.settle``);
* commit honours only a booking that is still valid and still exclusively the pod's, judged
  on the Lease as the apiserver holds it, and finds it even when another replica booked it a
  moment ago and this replica's Lease watch has not delivered that write yet.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field, replace

from opentelemetry import trace

from rgpu_contracts import (
    Allocation,
    AllocationRequest,
    Claim,
    ClaimSet,
    ClaimState,
    NodeName,
    NoFit,
    Reason,
    ServerName,
)
from rgpu_placement import (
    Choice,
    Demand,
    FleetView,
    Refusal,
    Validity,
    choose,
    demand_of,
    expires_at,
    winner,
)
from rgpu_runtime import pod_attributes, trace_exemplar

from .annotations import binding_annotations
from .booker import Booked, Booker
from .claims import LeaseRecord
from .clients import KubeApi
from .errors import (
    BookingExpired,
    CardsGone,
    ClaimNotFound,
    Contended,
    FleetUnknown,
    NotSynced,
    ServerTaken,
    StillRunning,
)
from .instruments import Instruments
from .judging import Judge, Policy, Remover, read_pod
from .leases import Edited, Finder, KeyedLocks, LeaseWriter
from .preempting import Outcome, Preemptor
from .rechecking import Reprober, Revalidator
from .wakeup import Refused

__all__ = ["ROUNDS", "Booking"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

ROUNDS = 10
"""Decide-and-book rounds per request: each lost round means another replica just took the
server, so a few rounds cover any realistic burst before answering "retry"."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Again:
    """Decide once more: a blocked server was re-validated or re-probed (``fresh``: the view
    with its new state), or the booking race was lost."""

    revalidated: bool = False
    fresh: FleetView | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Checks:
    """The fresh looks a refusal may still take; each is taken at most once per request."""

    revalidator: Revalidator | None
    reprober: Reprober | None

    def after(self, again: _Again) -> _Checks:
        revalidator = None if again.revalidated else self.revalidator
        reprober = None if again.fresh is not None else self.reprober
        return replace(self, revalidator=revalidator, reprober=reprober)

    async def recheck(self, view: FleetView, refusal: Refusal) -> _Again | None:
        """Look again at what blocked the servers that nearly fit; ``None`` if nothing moved."""
        claimed, busy = refusal.blocked_by_claims, refusal.blocked_by_busy
        if self.revalidator is not None and claimed and await self.revalidator.revalidate(claimed):
            return _Again(revalidated=True)
        fresh = (
            await self.reprober.refresh(view, busy) if self.reprober is not None and busy else None
        )
        return _Again(fresh=fresh) if fresh is not None else None


def _main_reason(nofit: NoFit) -> str:
    if not nofit.reasons:
        return Reason.NO_SERVERS.value
    return max(nofit.reasons, key=lambda r: (r.count, r.reason.value)).reason.value


@dataclass(frozen=True, slots=True, kw_only=True)
class Booking:
    """Book, commit, release and look up claims, as the routes call them."""

    policy: Policy
    judge: Judge
    writer: LeaseWriter
    booker: Booker
    remover: Remover
    finder: Finder
    revalidator: Revalidator
    reprober: Reprober
    refused: Refused
    instruments: Instruments
    preemptor: Preemptor
    api: KubeApi
    pod_locks: KeyedLocks = field(default_factory=KeyedLocks)
    """Requests for one pod go one at a time in a replica (the second finds the first's claim)."""

    async def allocate(self, request: AllocationRequest) -> Allocation | NoFit:
        """Choose and (unless ``dry_run``) book a server for ``request.pod``.

        Returns the ``Allocation`` or, when nothing fits, a ``NoFit`` with HAMi's reasons. Raises
        ``FleetUnknown``/``NotSynced`` before the inputs are in, ``Contended`` after ``ROUNDS``
        lost races, and ``KubeUnavailable`` when the apiserver is away.
        """
        self._require_view()
        self._require_synced()
        pod = request.pod
        attributes: dict[str, str | bool] = {
            **pod_attributes(namespace=pod.namespace, name=pod.name, uid=pod.uid),
            "rgpu.dry_run": request.dry_run,
        }
        with tracer.start_as_current_span("allocate", attributes=attributes):
            async with self.pod_locks.hold(request.pod.uid):
                return await self._allocate(request)

    async def commit(self, uid: str, node: str) -> Allocation:
        """Commit ``uid``'s booking for ``node`` and return the Binding's annotations.

        Raises ``ClaimNotFound`` (no claim), ``BookingExpired`` (lapsed), ``ServerTaken`` (another
        pod holds the cards), ``CardsGone`` (cards left the fleet) and ``KubeUnavailable``.
        """
        view = self._require_view()
        attributes = {"k8s.pod.uid": uid, "k8s.node.name": node}
        with tracer.start_as_current_span("commit", attributes=attributes):
            claims = await self.finder.claims(uid)
            target = winner(c for c in claims if self.judge.validity(c).blocks) or winner(claims)
            if target is None:
                raise ClaimNotFound(f"no claim for pod uid {uid}; book it first")
            annotations = self._annotations(view, target)
            committed = await self.writer.edit(
                target.server, lambda record: self._committed(uid, node, record), op="commit"
            )
            await self.remover.settle(uid)
        logger.info("committed %s on %s for node %s", target.pod.key, target.server, node)
        return self.allocation_of(committed, annotations)

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
        self.refused.forget(uid)

    def lookup(self, uid: str) -> Allocation:
        """The pod's current allocation; raises ``ClaimNotFound`` when it holds no valid claim."""
        claim = winner(self.judge.live(uid))
        if claim is None:
            raise ClaimNotFound(f"no valid claim for pod uid {uid}")
        return self.allocation_of(claim)

    async def claims(self, since: int | None, wait: float) -> ClaimSet:
        """Every stored claim, once the revision differs from ``since`` (or after ``wait``)."""
        ledger = self.judge.ledger
        if since is not None:
            await ledger.wait_newer(since, wait)
        return ledger.claim_set()

    def allocation_of(
        self, claim: Claim, annotations: tuple[tuple[str, str], ...] = ()
    ) -> Allocation:
        """The API view of ``claim``."""
        view = self.judge.inputs.view
        facts = view.facts.get(claim.server) if view is not None else None
        endpoint = facts.server.endpoint if facts is not None else None
        pod = self.judge.pods.get(claim.pod.uid)
        return Allocation(
            pod=claim.pod,
            server=claim.server,
            endpoint=endpoint or "",
            cards=claim.cards,
            containers=claim.containers,
            state=claim.state,
            booked_at=claim.booked_at,
            expires_at=expires_at(claim, pod, self.policy.ttl),
            annotations=annotations,
        )

    def _require_view(self) -> FleetView:
        """The fleet to decide on; raises ``FleetUnknown`` before discovery delivered one."""
        inputs = self.judge.inputs
        if inputs.view is None:
            reason = inputs.discovery_error or "no answer yet"
            raise FleetUnknown(f"no fleet from discovery yet ({reason}); retry shortly")
        return inputs.view

    def _require_synced(self) -> None:
        """Raises ``NotSynced`` until pods and Leases have been listed once."""
        if not (self.judge.pods.synced and self.judge.ledger.synced):
            raise NotSynced("pods and claim Leases are still being listed; retry shortly")

    async def _allocate(self, request: AllocationRequest) -> Allocation | NoFit:
        held = await self._held(request)
        if held is not None:
            return held
        demand = demand_of(request.containers, cuda_major=request.cuda_major)
        checks = _Checks(revalidator=self.revalidator, reprober=self.reprober)
        # Fresh reads and re-probes happen at most once per request; later rounds decide on what
        # they found (a re-probed view stays in use: it is fresher than the cached fleet for them).
        fresh: FleetView | None = None
        for _ in range(ROUNDS):
            answer = await self._round(request, demand, checks, fresh)
            if not isinstance(answer, _Again):
                return answer
            checks = checks.after(answer)
            fresh = answer.fresh if answer.fresh is not None else fresh
        raise Contended(f"could not book a server for {request.pod.key}: every choice was taken")

    async def _held(self, request: AllocationRequest) -> Allocation | None:
        claim = winner(self.judge.live(request.pod.uid))
        if claim is None:
            return None
        if not request.dry_run and self.judge.ledger.servers_of(request.pod.uid) > 1:
            claim = await self.remover.settle(request.pod.uid) or claim
        self.instruments.decisions.labels("reused", "").inc()
        self.refused.forget(request.pod.uid)
        return self.allocation_of(claim)

    async def _round(
        self,
        request: AllocationRequest,
        demand: Demand,
        checks: _Checks,
        fresh: FleetView | None,
    ) -> Allocation | NoFit | _Again:
        view = fresh if fresh is not None else self._require_view()
        nominated = self.preemptor.nominated_on(request.pod.uid)
        outcome = self._decide(request, demand, view, nominated)
        if isinstance(outcome, Refusal):
            again = await checks.recheck(view, outcome)
            if again is not None:
                return again
            held = nominated is not None
            if not request.dry_run and outcome.blocked_by_claims:
                preempted = await self.preemptor.preempt(request, demand, view)
                if preempted is Outcome.NOMINATED and await self._victims_gone(request, checks):
                    # Victims that had not started are deleted by their eviction at once: the
                    # pod books the server now instead of after the backoff of a refusal.
                    used = checks.after(_Again(revalidated=True))
                    return await self._round(request, demand, used, fresh)
                held = preempted.holds or held
            # Remembered after preempting, before the nudge it asked for runs: a pod held to
            # its nominated server is first in line, so its victims' leaving wakes it at once.
            return self._refuse(request, outcome, nominee=held)
        if request.dry_run:
            return self._preview(request, outcome)
        booked = await self.booker.book(self._booked(request, demand, outcome))
        if booked is None:
            return _Again()
        kept = await self.remover.settle(request.pod.uid) or booked
        self.instruments.decisions.labels("allocated", "").inc()
        self.refused.forget(request.pod.uid)
        logger.info("booked %s for pod %s", kept.server, request.pod.key)
        return self.allocation_of(kept)

    async def _victims_gone(self, request: AllocationRequest, checks: _Checks) -> bool:
        """Whether the victims just evicted for ``request.pod`` have left its nominated
        server, after fresh reads of them (once per request)."""
        server = self.preemptor.nominated_on(request.pod.uid)
        if server is None or checks.revalidator is None:
            return False
        await checks.revalidator.revalidate((server,))
        return not self.preemptor.victims_hold(server)

    def _decide(
        self,
        request: AllocationRequest,
        demand: Demand,
        view: FleetView,
        nominated: ServerName | None,
    ) -> Choice | Refusal:
        started = time.perf_counter()
        with tracer.start_as_current_span("choose"):
            outcome = choose(
                view,
                demand,
                self.judge.occupancy(request.pod.uid),
                candidates=request.candidate_nodes,
                granularity=self.policy.granularity,
                nominated=nominated,
            )
        self.instruments.decision_seconds.observe(time.perf_counter() - started, trace_exemplar())
        return outcome

    def _booked(self, request: AllocationRequest, demand: Demand, choice: Choice) -> Booked:
        return Booked(pod=request.pod, containers=request.containers, demand=demand, choice=choice)

    def _refuse(self, request: AllocationRequest, refusal: Refusal, *, nominee: bool) -> NoFit:
        # The server-by-server explanation is for a person asking (``rgpu explain``, a dry
        # run); kube-scheduler shows only the message, and encoding a verdict per server
        # made every refusal O(fleet) on the wire and in the extender.
        nofit = refusal.nofit if request.dry_run else replace(refusal.nofit, servers=())
        outcome = "dry_run" if request.dry_run else "refused"
        self.instruments.decisions.labels(outcome, _main_reason(nofit)).inc()
        if not request.dry_run:
            self.refused.remember(request.pod, first=nominee)
            logger.info("no server for pod %s: %s", request.pod.key, nofit.message)
        return nofit

    def _preview(self, request: AllocationRequest, choice: Choice) -> Allocation:
        self.instruments.decisions.labels("dry_run", "").inc()
        booked = self._booked(request, demand_of(request.containers), choice)
        return self.allocation_of(self.booker.claim(booked, choice, self.judge.clock()))

    def _annotations(self, view: FleetView, target: Claim) -> tuple[tuple[str, str], ...]:
        facts = view.facts.get(target.server)
        endpoint = facts.server.endpoint if facts is not None else None
        if not endpoint:
            raise CardsGone(f"{target.server} has no lupine endpoint now; filter the pod again")
        return binding_annotations(
            target, endpoint=endpoint, cards=view.cards, granularity=self.policy.granularity
        )

    def _committed(self, uid: str, node: str, record: LeaseRecord | None) -> Edited[Claim]:
        """The commit, judged on the claim as found in ``record`` (the Lease as read)."""
        claim = record.claim_of(uid) if record is not None else None
        if record is None or claim is None:
            raise ClaimNotFound(f"the claim of pod uid {uid} was released; filter the pod again")
        if self.judge.validity(claim) is not Validity.VALID:
            raise BookingExpired(
                f"the booking of {claim.pod.key} on {claim.server} expired "
                f"(older than {self.policy.ttl:g} s); filter the pod again"
            )
        held = self.judge.occupancy(uid, leases=lambda s: record)
        taken = held.taken(claim.server)
        if held.blocking(claim.server) and (
            self.policy.granularity == "server" or taken & set(claim.cards)
        ):
            raise ServerTaken(f"{claim.server} is held by another pod; filter the pod again")
        state = ClaimState.BOUND if claim.state is ClaimState.BOUND else ClaimState.COMMITTED
        committed = dataclasses.replace(
            claim, state=state, committed_at=self.judge.clock(), node=NodeName(node)
        )
        return Edited((*record.without(uid), committed), committed)
