"""A refusal on the filter path must be neither stale nor final too early: before answering
"no fit" the allocator takes one fresh look at what blocked the servers that nearly fit (the
holders' pods read again, busy servers probed again: ``revalidation``), and a pod of priority
refused because servers are held may free one (``preempting``). Each fresh look is taken at
most once per request (``Checks``); a look that changed something asks for another round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from rgpu_contracts import AllocationRequest, NoFit, Reason
from rgpu_placement import FleetView, Refusal

from .deciding import Seen
from .instruments import Instruments
from .preempting import Preemptor
from .preemption_outcomes import Outcome
from .revalidation import Reprober, Revalidator
from .waiters import Refused

__all__ = ["Again", "Checks", "Refusals"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Again:
    """Decide once more: a blocked server was re-validated or re-probed (``fresh``: the view
    with its new state), the victims of a preemption are gone, or the booking race was lost."""

    revalidated: bool = False
    fresh: FleetView | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Checks:
    """The fresh looks a refusal may still take; each is taken at most once per request."""

    revalidator: Revalidator | None
    reprober: Reprober | None

    def after(self, again: Again) -> Checks:
        revalidator = None if again.revalidated else self.revalidator
        reprober = None if again.fresh is not None else self.reprober
        return replace(self, revalidator=revalidator, reprober=reprober)

    async def recheck(self, view: FleetView, refusal: Refusal) -> Again | None:
        """Look again at what blocked the servers that nearly fit; ``None`` if nothing moved."""
        claimed, busy = refusal.blocked_by_claims, refusal.blocked_by_busy
        if self.revalidator is not None and claimed and await self.revalidator.revalidate(claimed):
            return Again(revalidated=True)
        fresh = (
            await self.reprober.refresh(view, busy) if self.reprober is not None and busy else None
        )
        return Again(fresh=fresh) if fresh is not None else None


def _main_reason(nofit: NoFit) -> str:
    if not nofit.reasons:
        return Reason.NO_SERVERS.value
    return max(nofit.reasons, key=lambda r: (r.count, r.reason.value)).reason.value


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusals:
    """What the filter path does with a refusal: look again, preempt, or answer ``NoFit``."""

    preemptor: Preemptor
    refused: Refused
    instruments: Instruments

    async def handle(
        self, request: AllocationRequest, seen: Seen, refusal: Refusal, checks: Checks
    ) -> Again | NoFit:
        again = await checks.recheck(seen.view, refusal)
        if again is not None:
            return again
        held = seen.nominated is not None
        if not request.dry_run and refusal.blocked_by_claims:
            preempted = await self.preemptor.preempt(request, seen.demand, seen.view)
            evicted = preempted in (Outcome.NOMINATED, Outcome.RESUMED)
            if evicted and await self._victims_gone(seen, checks):
                # Victims that had not started are deleted by their eviction at once: the pod
                # books the server now instead of after the backoff of a refusal.
                return Again(revalidated=True)
            held = preempted.holds or held
        # Remembered after preempting, before the nudge it asked for runs: a pod held to its
        # nominated server is first in line, so its victims' leaving wakes it at once.
        return self.refuse(request, refusal, nominee=held)

    def refuse(self, request: AllocationRequest, refusal: Refusal, *, nominee: bool) -> NoFit:
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

    async def _victims_gone(self, seen: Seen, checks: Checks) -> bool:
        """Whether the victims just evicted for the pod have left its nominated server, after
        fresh reads of them (once per request)."""
        server = self.preemptor.nominations.nominated_on(seen.pod.uid, seen.view)
        if server is None or checks.revalidator is None:
            return False
        await checks.revalidator.revalidate((server,))
        return not self.preemptor.nominations.victims_hold(server)
