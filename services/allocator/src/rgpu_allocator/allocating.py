"""``POST /v1/allocations`` — choose a server for a pod and book it
durably — is the heart of rgpu, and its rules are subtle enough to deserve their own module:

* idempotent per pod uid: a pod holding a valid claim gets that claim back;
* the choice is made on the cached state, the booking is a compare-and-swap on the chosen
  server's Lease that re-checks the fit on the Lease as the apiserver holds it; losing the
  race means deciding again (another server, or the same one if still free);
* no stale refusal: a refusal caused by claims first re-validates the blockers, and one
  caused only by lupine's busy reports first has discovery probe those servers again;
* replicas racing on the same pod settle on one server (``settle``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from opentelemetry import trace

from rgpu_contracts import Allocation, AllocationRequest, Claim, ClaimState, NoFit, Reason
from rgpu_placement import (
    Choice,
    Demand,
    FleetView,
    Refusal,
    assign,
    choose,
    demand_of,
    fit,
    winner,
)

from .core import Core
from .errors import Contended
from .leases import LeaseRecord
from .reprobing import Reprober
from .revalidating import Revalidator
from .settling import settle

__all__ = ["ROUNDS", "allocate"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

ROUNDS = 10
"""Decide-and-book rounds per request: each lost round means another replica just took the
server, so a few rounds cover any realistic burst before answering "retry"."""


class _Lost(Exception):
    """The chosen server stopped fitting between the decision and the write."""


class _Again:
    """Decide once more: a blocked server was re-validated or re-probed (``fresh``: the view
    with its new state), or the booking race was lost."""

    __slots__ = ("fresh", "revalidated")

    def __init__(self, *, revalidated: bool = False, fresh: FleetView | None = None) -> None:
        self.revalidated = revalidated
        self.fresh = fresh


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


def _decide(
    core: Core, request: AllocationRequest, demand: Demand, view: FleetView
) -> Choice | Refusal:
    started = time.perf_counter()
    with tracer.start_as_current_span("choose"):
        outcome = choose(
            view,
            demand,
            core.occupancy(request.pod.uid),
            candidates=request.candidate_nodes,
            granularity=core.policy.granularity,
        )
    core.instruments.decision_seconds.observe(time.perf_counter() - started)
    return outcome


def _claim(core: Core, request: AllocationRequest, choice: Choice, now: float) -> Claim:
    facts = choice.fit.facts
    return Claim(
        pod=request.pod,
        server=facts.name,
        cards=tuple(c.id for c in sorted(choice.fit.cards, key=lambda c: (c.index, c.id))),
        containers=assign(request.containers, choice.fit.cards, core.policy.granularity),
        state=ClaimState.BOOKED,
        booked_at=now,
    )


async def _book(
    core: Core, request: AllocationRequest, demand: Demand, choice: Choice
) -> Claim | None:
    """Write the booking, re-checking the fit on the Lease as read; ``None`` if it was lost."""
    uid = request.pod.uid
    server = choice.fit.facts.name
    now = core.clock()
    booked: list[Claim] = []

    def change(record: LeaseRecord | None) -> tuple[Claim, ...] | None:
        held = core.occupancy(uid, leases=lambda s: record if s == server else core.ledger.lease(s))
        found = fit(choice.fit.facts, demand, held, core.policy.granularity)
        if found is None:
            raise _Lost
        claim = _claim(core, request, Choice(fit=found, tier=choice.tier), now)
        booked[:] = [claim]
        others = record.claims if record is not None else ()
        keep = tuple(c for c in others if c.pod.uid != uid and held.validity(c).blocks)
        return (*keep, claim)

    # Registered before the first await: concurrent decisions in this replica see it at once.
    tentative = _claim(core, request, choice, now)
    attributes = {"server": server, "pod.uid": uid}
    with tracer.start_as_current_span("book", attributes=attributes), core.pending.hold(tentative):
        try:
            await core.writer.edit(server, change, op="book")
        except _Lost:
            return None
    return booked[0]


def _main_reason(nofit: NoFit) -> str:
    if not nofit.reasons:
        return Reason.NO_SERVERS.value
    return max(nofit.reasons, key=lambda r: (r.count, r.reason.value)).reason.value


def _refuse(core: Core, request: AllocationRequest, refusal: Refusal) -> NoFit:
    nofit = refusal.nofit
    outcome = "dry_run" if request.dry_run else "refused"
    core.instruments.decisions.labels(outcome, _main_reason(nofit)).inc()
    if not request.dry_run:
        core.refused.remember(request.pod)
        logger.info("no server for pod %s: %s", request.pod.key, nofit.message)
    return nofit


def _preview(core: Core, request: AllocationRequest, choice: Choice) -> Allocation:
    core.instruments.decisions.labels("dry_run", "").inc()
    return core.allocation_of(_claim(core, request, choice, core.clock()))


async def _held(core: Core, request: AllocationRequest) -> Allocation | None:
    claim = winner(core.live(request.pod.uid))
    if claim is None:
        return None
    if not request.dry_run and core.ledger.servers_of(request.pod.uid) > 1:
        claim = await settle(core, request.pod.uid) or claim
    core.instruments.decisions.labels("reused", "").inc()
    core.refused.forget(request.pod.uid)
    return core.allocation_of(claim)


async def _round(
    core: Core, request: AllocationRequest, demand: Demand, checks: _Checks, fresh: FleetView | None
) -> Allocation | NoFit | _Again:
    view = fresh if fresh is not None else core.require_view()
    outcome = _decide(core, request, demand, view)
    if isinstance(outcome, Refusal):
        return await checks.recheck(view, outcome) or _refuse(core, request, outcome)
    if request.dry_run:
        return _preview(core, request, outcome)
    booked = await _book(core, request, demand, outcome)
    if booked is None:
        return _Again(revalidated=False)
    kept = await settle(core, request.pod.uid) or booked
    core.instruments.decisions.labels("allocated", "").inc()
    core.refused.forget(request.pod.uid)
    logger.info("booked %s for pod %s", kept.server, request.pod.key)
    return core.allocation_of(kept)


async def allocate(
    core: Core, request: AllocationRequest, revalidator: Revalidator, reprober: Reprober
) -> Allocation | NoFit:
    """Choose and (unless ``dry_run``) book a server for ``request.pod``.

    Returns the ``Allocation`` or, when nothing fits, a ``NoFit`` with HAMi's reasons. Raises
    ``FleetUnknown``/``NotSynced`` before the inputs are in, ``Contended`` after ``ROUNDS``
    lost races, and ``KubeUnavailable`` when the apiserver is away.
    """
    core.require_view()
    core.require_synced()
    attributes: dict[str, str | bool] = {
        "pod": request.pod.key,
        "pod.uid": request.pod.uid,
        "dry_run": request.dry_run,
    }
    with tracer.start_as_current_span("allocate", attributes=attributes):
        async with core.pod_locks.hold(request.pod.uid):
            return await _allocate(
                core, request, _Checks(revalidator=revalidator, reprober=reprober)
            )


async def _allocate(core: Core, request: AllocationRequest, checks: _Checks) -> Allocation | NoFit:
    held = await _held(core, request)
    if held is not None:
        return held
    demand = demand_of(request.containers)
    # Fresh reads and re-probes happen at most once per request; later rounds decide on what
    # they found (a re-probed view stays in use: it is fresher than the cached fleet for them).
    fresh: FleetView | None = None
    for _ in range(ROUNDS):
        answer = await _round(core, request, demand, checks, fresh)
        if not isinstance(answer, _Again):
            return answer
        checks = checks.after(answer)
        fresh = answer.fresh if answer.fresh is not None else fresh
    raise Contended(f"could not book a server for {request.pod.key}: every choice was taken")
