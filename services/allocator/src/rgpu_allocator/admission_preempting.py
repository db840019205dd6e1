"""A gated pod of priority that no server fits because servers are held is a preemption's
reason to be: the admission pass starts one for it (``Preemptor``) and goes on, and the pod
books nothing while it runs, since a booking made between the rehearsal of the evictions and
the nomination would leave its victims evicted for nothing. A few run at once: each is a few
apiserver calls (dry runs, budgets).
"""

from __future__ import annotations

from collections.abc import Callable

from anyio.abc import TaskGroup

from rgpu_contracts import AllocationRequest
from rgpu_placement import FleetView

from .preempting import Preemptor
from .preemption_outcomes import Outcome, may_preempt
from .verdicts import Verdict, Wait

__all__ = ["PREEMPTIONS_AT_ONCE", "Preempting"]

PREEMPTIONS_AT_ONCE = 4
"""Preemption attempts in flight at once: each is a few apiserver calls (dry runs, budgets)."""


class Preempting:
    """The preemptions admission passes started and that have not ended yet."""

    __slots__ = ("_admitting", "_notify", "_preemptor", "pods")

    def __init__(
        self,
        preemptor: Preemptor,
        *,
        notify: Callable[[], None],
        admitting: Callable[[str], bool],
    ) -> None:
        """``admitting(uid)``: whether the admitter is lifting ``uid``'s gate now."""
        self._preemptor, self._notify, self._admitting = preemptor, notify, admitting
        self.pods: set[str] = set()
        """The pods whose preemption is under way: they book nothing meanwhile."""

    def busy(self) -> frozenset[str]:
        """The pods that book nothing now: those preempting, and the victims whose booking a
        preemption may take back (lifting their gate meanwhile would leave nothing booked)."""
        return frozenset(self.pods) | self._preemptor.taking_back()

    def start(self, verdict: Verdict, view: FleetView, tg: TaskGroup) -> None:
        """Start a preemption for ``verdict``'s pod if it is refused for held servers and
        may preempt, or waits for a server whose victims were not all evicted, unless one
        runs for it already or enough run at once."""
        if self._should(verdict, view):
            self.pods.add(verdict.pod.uid)
            tg.start_soon(self._preempt, verdict, view)

    def _should(self, verdict: Verdict, view: FleetView) -> bool:
        uid = verdict.pod.uid
        if uid in self.pods or len(self.pods) >= PREEMPTIONS_AT_ONCE:
            return False
        if not may_preempt(verdict.pod):
            return False
        if verdict.wait is Wait.PREEMPTING:
            # Its victims stopped going half-way: the rest must go, or those that went did
            # for nothing.
            return self._preemptor.unfinished(uid, view)
        refusal = verdict.refusal
        return (
            verdict.wait is Wait.NO_FIT and refusal is not None and bool(refusal.blocked_by_claims)
        )

    async def _preempt(self, verdict: Verdict, view: FleetView) -> None:
        pod, demand = verdict.pod, verdict.demand
        outcome = Outcome.NONE
        try:
            gated = pod.gated
            if demand is not None and gated is not None:
                request = AllocationRequest(pod=pod.ref, containers=gated.containers)
                outcome = await self._preemptor.preempt(
                    request, demand, view, admitting=self._admitting
                )
        finally:
            self.pods.discard(pod.uid)
            # A blocked preemption waits for what blocks it to change (an admission ending, a
            # nominee binding: each wakes the admitter) or for the next period (a budget, an
            # apiserver failing): trying again at once would spin.
            if outcome not in (Outcome.BLOCKED, Outcome.FAILED):
                self._notify()
