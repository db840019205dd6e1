"""Admission walks the gated pods and decides, for each, what happens now: book a server, lift
the gate of a pod already booked, or wait — and why. The walk is one synchronous pass over the
caches, so its decisions are consistent with each other: every booking a pass plans counts as
held for the pods after it (they spread over other servers), and a pod behind in line never
takes what a pod ahead of it was given.

The same pass serves the leader, which then carries it out, and anyone who asks where a pod
stands (``GET /v1/queue``, ``rgpu explain``) on any replica, which only reads it.

Rules of the walk:
* the order is the queue policy's (``rgpu_placement.FairWalk``): priority, then the namespace
  holding the fewest cards per unit of weight, then first come first served;
* a namespace never holds more cards than its quota (cards held or admitted; a whole-server
  booking counts every card of the server): its pods wait with ``QuotaExceeded``;
* a gang is booked whole or not at all: its members are decided one after the other, and one
  that does not fit takes back what the others were given in this pass;
* a unit that cannot be placed does not block the units behind it (a smaller ask may fit),
  but a unit waiting for capacity only claims hold (``Refusal.blocked_by_claims``) keeps the
  best of those servers from every unit of lower priority, so a stream of small low-priority
  asks cannot starve it (in card granularity they would nibble its server's cards as they free);
* once one pod of a shape is refused, the rest of that shape are refused with it in the same
  pass, without deciding again: nothing frees during a pass. A shape is what placement reads
  of an ask (card count, memory, CUDA major: not the containers' names or number), with the
  candidate nodes, the nomination and the gang's size; a queue of a thousand pods made a
  thousand ways holds few shapes, and the pass costs what its shapes do.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from rgpu_contracts import Claim, NodeName, ServerName
from rgpu_placement import (
    Choice,
    Demand,
    FairWalk,
    FleetView,
    Gang,
    Holdings,
    QueueConfig,
    Refusal,
    winner,
)

from .booker import Booked, Booker, Pending
from .candidates import Candidates
from .capacity import Capacity
from .deciding import Decider, Seen
from .demands import Demands
from .judging import Judge
from .passes import Pass, Reserved
from .pods import PodInfo
from .policy import Policy
from .units import Unit, units_of
from .verdicts import Verdict, Wait, no_fit_message

__all__ = ["Planner"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Planner:
    """Works out one pass over the gated pods; pure on the caches."""

    judge: Judge
    policy: Policy
    booker: Booker
    decider: Decider
    nominated_on: Callable[[str, FleetView], ServerName | None]
    """Where a pod is held to while its victims leave (``Nominations.nominated_on``)."""
    admission_ttl: float
    candidates: Candidates = field(default_factory=Candidates)
    capacity: Capacity = field(default_factory=lambda: Capacity())
    demands: Demands = field(default_factory=Demands)

    def plan(
        self,
        pods: Iterable[PodInfo],
        view: FleetView,
        *,
        limit: int,
        config: QueueConfig,
        held: Mapping[str, int],
        busy: Collection[str] = frozenset(),
    ) -> list[Verdict]:
        """Verdicts for ``pods`` (in arrival order) until ``limit`` bookings are planned;
        ``held`` counts the cards each namespace holds now."""
        units = units_of(pods)
        fair = FairWalk(
            units,
            namespace=lambda u: u.namespace,
            priority=lambda u: u.priority,
            held=held,
            config=config,
        )
        walk = Pass(pending=Pending(), fair=fair)
        verdicts: list[Verdict] = []
        for unit in fair:
            if walk.admitted >= limit:
                break
            verdicts.extend(self._unit(unit, view, walk, busy, config))
        return verdicts

    def _unit(
        self, unit: Unit, view: FleetView, walk: Pass, busy: Collection[str], config: QueueConfig
    ) -> list[Verdict]:
        if any(p.uid in busy for p in unit.pods):
            return [
                Verdict(pod=p, wait=Wait.ADMITTING, message="being admitted") for p in unit.pods
            ]
        if unit.problem is not None:
            return self._booked_whole(unit) or [
                Verdict(pod=p, wait=unit.problem[0], message=unit.problem[1]) for p in unit.pods
            ]
        # A namespace at its quota waits for that, whatever the pool: freed servers would not
        # go to it either, and a pod its quota holds back neither preempts nor keeps a server
        # from others (preemption never evicts for a pod over its quota).
        least = sum(self._least_cards(p) for p in unit.pods)
        at_quota = self._over_quota(unit, least, walk, config, least=True)
        if at_quota is not None:
            return [self._waits(Verdict(pod=p), at_quota, unit) for p in unit.pods]
        verdicts = [self._one(p, view, walk) for p in unit.pods]
        taken = [v.booked for v in verdicts if v.booked is not None]
        stop = next((v for v in verdicts if v.wait is not None), None)
        if stop is None:
            cards = sum(len(b.choice.fit.cards) for b in taken)
            stop = self._over_quota(unit, cards, walk, config)
        if stop is not None:
            for booked in taken:
                walk.pending.discard(self._claim(booked))
            return [self._waits(v, stop, unit) for v in verdicts]
        walk.admitted += len(taken)
        walk.fair.took(unit.namespace, sum(len(b.choice.fit.cards) for b in taken))
        if unit.gang is None or len(unit.pods) < 2:
            return verdicts
        return [_in_gang(v, unit.gang) for v in verdicts]

    def _waits(self, verdict: Verdict, stop: Verdict, unit: Unit) -> Verdict:
        """``verdict``'s pod waits because of ``stop`` (itself, or a sibling of its gang)."""
        if stop is verdict or unit.gang is None:
            return (
                stop
                if stop is verdict
                else Verdict(
                    pod=verdict.pod, wait=stop.wait, message=stop.message, demand=verdict.demand
                )
            )
        message = f"gang {unit.gang.name}: {stop.pod.name} waits: {stop.message}"
        return Verdict(pod=verdict.pod, wait=stop.wait, message=message, demand=verdict.demand)

    def _booked_whole(self, unit: Unit) -> list[Verdict]:
        """The gates to lift for what is left of a gang whose bookings were all written (a
        gang is booked whole before any gate is lifted) but some lifts failed: its other
        members are through the gate, so the rest no longer looks like a complete gang."""
        claims = [winner(self.judge.live(p.uid)) for p in unit.pods]
        if unit.gang is None or any(c is None for c in claims):
            return []
        return [Verdict(pod=p, held=c) for p, c in zip(unit.pods, claims, strict=True)]

    def _least_cards(self, pod: PodInfo) -> int:
        """The fewest cards ``pod`` could count against its quota (0 once it holds a claim:
        its cards are counted as held already)."""
        gated = pod.gated
        if gated is None or gated.problem is not None or winner(self.judge.live(pod.uid)):
            return 0
        demand = self.demands.of(gated.containers, gated.cuda_major)
        if self.policy.granularity == "card":
            return demand.effective_count
        return max((a.count for a in demand.asks), default=0)

    def _over_quota(
        self, unit: Unit, cards: int, walk: Pass, config: QueueConfig, *, least: bool = False
    ) -> Verdict | None:
        """Why ``unit`` would take its namespace over quota with ``cards`` more (``least``:
        at least that many, before a server is chosen), if it would."""
        quota = config.quota(unit.namespace).cards
        holds = walk.fair.held(unit.namespace)
        if quota is None or holds + cards <= quota:
            return None
        more = f"at least {cards}" if least else str(cards)
        message = (
            f"namespace {unit.namespace} holds {holds} card(s) of its {quota}-card quota and "
            f"this would take {more} more (ConfigMap rgpu-queues)"
        )
        return Verdict(pod=unit.pods[0], wait=Wait.QUOTA_EXCEEDED, message=message)

    def _one(self, pod: PodInfo, view: FleetView, walk: Pass) -> Verdict:
        gated = pod.gated
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
        demand = self.demands.of(gated.containers, gated.cuda_major)
        return self._decide(pod, view, walk, demand, candidates or ())

    def _decide(
        self,
        pod: PodInfo,
        view: FleetView,
        walk: Pass,
        demand: Demand,
        candidates: tuple[NodeName, ...],
    ) -> Verdict:
        nominated = self.nominated_on(pod.uid, view)
        gang = pod.gated.gang if pod.gated is not None else None
        size = gang.size if gang is not None else None
        shape = (
            demand.shape(self.policy.granularity),
            candidates,
            nominated,
            pod.priority if walk.reserved else 0,
            size,
        )
        before = walk.refused.get(shape)
        if before is not None:
            return Verdict(pod=pod, wait=before.wait, message=before.message, demand=demand)
        held: Holdings = self.judge.occupancy(pod.uid, planned=walk.pending.by_server)
        if walk.reserved:
            held = Reserved(held, walk.reserved, pod.priority)
        seen = Seen(
            pod=pod.ref,
            demand=demand,
            view=view,
            held=held,
            nominated=nominated,
            candidates=candidates,
        )
        outcome = self.decider.decide(seen)
        if isinstance(outcome, Choice):
            return self._admit(pod, demand, outcome, walk)
        verdict = self._behind(pod, seen, demand) or self._refused(
            pod, view, demand, outcome, nominated
        )
        walk.refused[shape] = verdict
        if outcome.blocked_by_claims:
            best = outcome.blocked_by_claims[0]
            walk.reserved[best] = max(walk.reserved.get(best, pod.priority), pod.priority)
        return verdict

    def _behind(self, pod: PodInfo, seen: Seen, demand: Demand) -> Verdict | None:
        """``pod`` waits behind priority when a server kept for a higher-priority pod would
        have fitted it."""
        if not isinstance(seen.held, Reserved):
            return None
        fits = self.decider.decide(replace(seen, held=seen.held.unreserved))
        if not isinstance(fits, Choice):
            return None
        message = (
            f"server {fits.fit.facts.name} would fit but is kept for a waiting pod of higher "
            f"priority than {pod.priority}"
        )
        return Verdict(pod=pod, wait=Wait.BEHIND_PRIORITY, message=message, demand=demand)

    def _admit(self, pod: PodInfo, demand: Demand, choice: Choice, walk: Pass) -> Verdict:
        gated = pod.gated
        assert gated is not None
        booked = Booked(
            pod=pod.ref,
            containers=gated.containers,
            demand=demand,
            choice=choice,
            admission_ttl=self.admission_ttl,
        )
        walk.pending.add(self._claim(booked))
        return Verdict(pod=pod, booked=booked, demand=demand)

    def _claim(self, booked: Booked) -> Claim:
        return self.booker.claim(booked, booked.choice, 0.0)

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
        never = self._never(pod, view, demand)
        if never is not None:
            return Verdict(pod=pod, wait=Wait.NEVER_FITS, message=never, demand=demand)
        message = no_fit_message(refusal)
        return Verdict(pod=pod, wait=Wait.NO_FIT, message=message, refusal=refusal, demand=demand)

    def _never(self, pod: PodInfo, view: FleetView, demand: Demand) -> str | None:
        """Why ``pod`` can never be admitted on this fleet (too large a request, or a gang of
        more members than servers that could take one), remembered per fleet and shape."""
        gang = pod.gated.gang if pod.gated is not None else None
        size = gang.size if gang is not None and gang.size is not None else 1
        return self.capacity.never(view.fleet, demand, self.policy.granularity, size)


def _in_gang(verdict: Verdict, gang: Gang) -> Verdict:
    """``verdict`` as one of a gang's, lifted only once every member is written."""
    return Verdict(
        pod=verdict.pod, booked=verdict.booked, held=verdict.held, demand=verdict.demand, gang=gang
    )
