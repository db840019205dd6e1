"""Admission walks the gated pods in queue order and decides, for each, what happens now: book
a server, lift the gate of a pod already booked, or wait — and why. The walk is one
synchronous pass over the caches, so its decisions are consistent with each other: every
booking a pass plans counts as held for the pods after it (they spread over other servers),
and a pod behind in line never takes what a pod ahead of it was given.

The same pass serves the leader, which then carries it out, and anyone who asks where a pod
stands (``GET /v1/queue``, ``rgpu explain``) on any replica, which only reads it.

Rules of the walk:
* a pod that cannot be placed does not block the pods behind it (a smaller ask may fit);
* a pod waiting for capacity that only claims hold (``Refusal.blocked_by_claims``) keeps the
  best of those servers from every pod of lower priority behind it, so a stream of small
  low-priority asks cannot starve it (in card granularity they would otherwise nibble its
  server's cards as they free);
* once one pod of a shape (ask, candidate nodes) is refused, the rest of that shape are
  refused with it in the same pass, without deciding again: nothing frees during a pass.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from rgpu_contracts import Card, CardId, Claim, NodeName, Reason, ServerName
from rgpu_placement import (
    Choice,
    Demand,
    FleetView,
    Holdings,
    Refusal,
    ServerFacts,
    choose,
    demand_of,
    winner,
)

from .booker import Booked, Booker
from .candidates import Candidates
from .judging import Judge, Policy
from .leases import Layered, Pending
from .pods import PodInfo

__all__ = ["Planner", "Verdict", "Wait"]


class Wait(enum.StrEnum):
    """Why a gated pod is not admitted now (the metric label and the Event's theme)."""

    NO_FIT = "NoFit"
    """No server fits the pod now; the message gives HAMi's per-card reasons."""
    NEVER_FITS = "NeverFits"
    """No server of the fleet could take the pod even if every one were free."""
    PREEMPTING = "Preempting"
    """A server is being freed for the pod (its victims are leaving)."""
    BEHIND_PRIORITY = "BehindPriority"
    """What fits is kept for a waiting pod of higher priority."""
    NO_CLIENT_NODE = "NoClientNode"
    """No client node matches the pod's node selector or required affinity."""
    UNREADABLE = "UnreadableRequest"
    """The pod's remote-GPU ask cannot be read."""
    ADMITTING = "Admitting"
    """A booking or the gate's removal is in flight."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What the pass decided for one pod."""

    pod: PodInfo
    booked: Booked | None = None
    """Book this now."""
    held: Claim | None = None
    """Already booked (a leader before us, or this one a moment ago): lift the gate."""
    wait: Wait | None = None
    message: str = ""
    refusal: Refusal | None = None
    """What blocked the pod, for preemption."""
    demand: Demand | None = None


@dataclass(slots=True)
class _Pass:
    """What one walk has learnt so far."""

    pending: Pending
    refused: dict[object, Verdict] = field(default_factory=dict)
    reserved: dict[ServerName, int] = field(default_factory=dict)
    admitted: int = 0


class _Reserved:
    """``held`` with the servers kept for higher-priority pods marked unusable."""

    __slots__ = ("_held", "_priority", "_reserved")

    def __init__(self, held: Holdings, reserved: dict[ServerName, int], priority: int) -> None:
        self._held, self._reserved, self._priority = held, reserved, priority

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return self._held.blocking(server)

    def problem(self, server: str) -> str | None:
        if self._reserved.get(ServerName(server), self._priority) > self._priority:
            return "kept for a waiting pod of higher priority"
        return self._held.problem(server)

    def taken(self, server: str) -> frozenset[CardId]:
        return self._held.taken(server)

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return self._held.busy(facts)

    def without_claims(self) -> Holdings:
        return _Reserved(self._held.without_claims(), self._reserved, self._priority)


def _takes(cards: tuple[Card, ...], demand: Demand, granularity: str) -> bool:
    if granularity == "card":
        return sum(c.memory_mib >= demand.max_memory_mib for c in cards) >= demand.effective_count
    return all(sum(c.memory_mib >= a.memory_mib for c in cards) >= a.count for a in demand.asks)


def never_fits(view: FleetView, demand: Demand, granularity: str) -> str | None:
    """Why no server of the fleet could take ``demand`` even if all were free; ``None`` when
    one could."""
    servers = view.fleet.servers
    if any(_takes(s.cards, demand, granularity) for s in servers):
        return None
    if not servers:
        return "no remote GPU server is known yet"
    largest = max(servers, key=lambda s: (len(s.cards), s.name))
    memory = max((c.memory_mib for c in largest.cards), default=0)
    asked = max((a.count for a in demand.asks), default=0)
    if granularity == "card":
        asked = demand.effective_count
    return (
        f"no remote GPU server can ever take this pod: it asks for {asked} card(s) of at least "
        f"{demand.max_memory_mib} MiB on one server; the largest server, {largest.name}, has "
        f"{len(largest.cards)} card(s) of up to {memory} MiB"
    )


def _main_reason(refusal: Refusal) -> str:
    reasons = refusal.nofit.reasons
    if not reasons:
        return Reason.NO_SERVERS.value
    return max(reasons, key=lambda r: (r.count, r.reason.value)).reason.value


@dataclass(frozen=True, slots=True, kw_only=True)
class Planner:
    """Works out one pass over the gated pods; pure on the caches."""

    judge: Judge
    policy: Policy
    booker: Booker
    nominated_on: Callable[[str], ServerName | None]
    """Where a pod is held to while its victims leave (``Preemptor.nominated_on``)."""
    admission_ttl: float
    candidates: Candidates = field(default_factory=Candidates)

    def plan(
        self,
        pods: Iterable[PodInfo],
        view: FleetView,
        *,
        limit: int,
        busy: Collection[str] = frozenset(),
    ) -> list[Verdict]:
        """Verdicts for ``pods`` (in queue order) until ``limit`` bookings are planned."""
        walk = _Pass(pending=Layered(self.judge.pending))
        verdicts: list[Verdict] = []
        for pod in pods:
            if walk.admitted >= limit:
                break
            verdict = self._one(pod, view, walk, busy)
            verdicts.append(verdict)
        return verdicts

    def _one(self, pod: PodInfo, view: FleetView, walk: _Pass, busy: Collection[str]) -> Verdict:
        gated = pod.gated
        if pod.uid in busy:
            return Verdict(pod=pod, wait=Wait.ADMITTING, message="being admitted")
        if gated is None or gated.problem is not None:
            problem = gated.problem if gated is not None else "not gated"
            return Verdict(pod=pod, wait=Wait.UNREADABLE, message=problem or "")
        held = winner(self.judge.live(pod.uid))
        if held is not None:
            return Verdict(pod=pod, held=held)
        candidates = self.candidates.of(view, gated.placement)
        if candidates == ():
            message = "no client node matches the pod's nodeSelector or required node affinity"
            return Verdict(pod=pod, wait=Wait.NO_CLIENT_NODE, message=message)
        return self._decide(pod, view, walk, demand_of(gated.containers), candidates or ())

    def _decide(
        self,
        pod: PodInfo,
        view: FleetView,
        walk: _Pass,
        demand: Demand,
        candidates: tuple[NodeName, ...],
    ) -> Verdict:
        nominated = self.nominated_on(pod.uid)
        shape = (demand, candidates, nominated, pod.priority if walk.reserved else 0)
        seen = walk.refused.get(shape)
        if seen is not None:
            return Verdict(pod=pod, wait=seen.wait, message=seen.message, demand=demand)
        held: Holdings = self.judge.occupancy(pod.uid, pending=walk.pending.claims)
        if walk.reserved:
            held = _Reserved(held, walk.reserved, pod.priority)
        outcome = choose(
            view,
            demand,
            held,
            candidates=candidates,
            granularity=self.policy.granularity,
            nominated=nominated,
        )
        if isinstance(outcome, Choice):
            return self._admit(pod, demand, outcome, walk)
        verdict = self._refused(pod, view, demand, outcome, nominated)
        walk.refused[shape] = verdict
        if outcome.blocked_by_claims:
            best = outcome.blocked_by_claims[0]
            walk.reserved[best] = max(walk.reserved.get(best, pod.priority), pod.priority)
        return verdict

    def _admit(self, pod: PodInfo, demand: Demand, choice: Choice, walk: _Pass) -> Verdict:
        gated = pod.gated
        assert gated is not None
        booked = Booked(
            pod=pod.ref,
            containers=gated.containers,
            demand=demand,
            choice=choice,
            admission_ttl=self.admission_ttl,
        )
        walk.admitted += 1
        walk.pending.add(self.booker.claim(booked, choice, self.judge.clock()))
        return Verdict(pod=pod, booked=booked, demand=demand)

    def _refused(
        self,
        pod: PodInfo,
        view: FleetView,
        demand: Demand,
        refusal: Refusal,
        nominated: ServerName | None,
    ) -> Verdict:
        if nominated is not None:
            message = f"server {nominated} is being freed for this pod; {refusal.nofit.message}"
            return Verdict(
                pod=pod, wait=Wait.PREEMPTING, message=message, refusal=refusal, demand=demand
            )
        never = never_fits(view, demand, self.policy.granularity)
        if never is not None:
            return Verdict(pod=pod, wait=Wait.NEVER_FITS, message=never, demand=demand)
        if _main_reason(refusal) == Reason.NO_SERVERS.value or not refusal.nofit.reasons:
            message = refusal.nofit.message
        else:
            message = f"no remote GPU server fits now: {refusal.nofit.message}"
        return Verdict(pod=pod, wait=Wait.NO_FIT, message=message, refusal=refusal, demand=demand)
