"""``rgpu simulate`` with queues answers "what would these quotas and weights do to my teams'
waits?" before the ConfigMap is changed, so its pass must be admission's: the same order
(``rgpu_placement.FairWalk``: the namespace holding least per unit of weight first, then first
come first served), the same quota rule (cards held or admitted, a whole-server booking
counting all the server's cards), gangs placed whole or not at all, and a unit that cannot be
placed never blocking the ones behind it. Placement is ``rgpu_placement.choose``, as the
allocator's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from rgpu_contracts import CardId, Claim, ClaimState, ContainerRequest, PodRef, PodUID
from rgpu_placement import (
    Choice,
    FairWalk,
    FleetView,
    Granularity,
    QueueConfig,
    ServerFacts,
    Unclaimed,
    cards_by_namespace,
    choose,
    demand_of,
)

__all__ = ["QUOTA_EXCEEDED", "Held", "SimPod", "admission_pass"]

QUOTA_EXCEEDED = "QuotaExceeded"
"""The refusal reason of a unit its namespace's quota holds back (admission's wait reason)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimPod:
    uid: str
    arrival: float
    run: float
    requests: tuple[ContainerRequest, ...]
    namespace: str = "default"
    gang: str | None = None
    """The gang the pod arrived in (its members are placed together or not at all)."""
    gang_size: int = 0

    @property
    def cards(self) -> int:
        return sum(r.count for r in self.requests)


class Held:
    """The simulator's claims, as placement's ``Holdings``, with each namespace's cards."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Claim]] = {}

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return tuple(self.claims.get(server, {}).values())

    def problem(self, server: str) -> str | None:
        return None

    def taken(self, server: str) -> frozenset[CardId]:
        return frozenset(c for claim in self.blocking(server) for c in claim.cards)

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        # Simulated servers report no lupine clients beyond the claims.
        return frozenset()

    def without_claims(self) -> Unclaimed:
        return Unclaimed()

    def add(self, claim: Claim) -> None:
        self.claims.setdefault(claim.server, {})[claim.pod.uid] = claim

    def remove(self, server: str, uid: str) -> None:
        self.claims.get(server, {}).pop(uid, None)

    def by_namespace(self) -> dict[str, int]:
        return cards_by_namespace(c for held in self.claims.values() for c in held.values())


def _claim(pod: SimPod, choice: Choice, now: float) -> Claim:
    return Claim(
        pod=PodRef(uid=PodUID(pod.uid), namespace=pod.namespace, name=pod.uid),
        server=choice.fit.facts.name,
        cards=tuple(c.id for c in choice.fit.cards),
        containers=(),
        state=ClaimState.BOUND,
        booked_at=now,
    )


def _units(waiting: Iterable[SimPod]) -> list[tuple[SimPod, ...]]:
    """Pods in arrival order as units: a pod alone, or a gang where its first member stands,
    once every member has arrived (until then it waits, holding nothing)."""
    units: list[list[SimPod]] = []
    gangs: dict[str, list[SimPod]] = {}
    for pod in waiting:
        if pod.gang is None:
            units.append([pod])
        elif pod.gang in gangs:
            gangs[pod.gang].append(pod)
        else:
            gangs[pod.gang] = [pod]
            units.append(gangs[pod.gang])
    return [tuple(u) for u in units if u[0].gang is None or len(u) >= u[0].gang_size]


def _least(pod: SimPod, granularity: Granularity) -> int:
    """The fewest cards ``pod`` could count against its quota."""
    demand = demand_of(pod.requests)
    if granularity == "card":
        return demand.effective_count
    return max((a.count for a in demand.asks), default=0)


@dataclass(slots=True)
class Pass:
    """One admission pass over the waiting pods."""

    view: FleetView
    held: Held
    granularity: Granularity
    config: QueueConfig
    now: float
    placed: list[Claim] = field(default_factory=list)
    refusals: dict[str, set[str]] = field(default_factory=dict)
    """Pod uid → the reasons it was refused in this pass."""
    _refused: dict[tuple[ContainerRequest, ...], set[str]] = field(default_factory=dict)

    def _refuse(self, unit: Sequence[SimPod], reasons: set[str]) -> None:
        for pod in unit:
            self.refusals.setdefault(pod.uid, set()).update(reasons)

    def _place(self, pod: SimPod, alone: bool) -> Claim | set[str]:
        # Placing only takes capacity away, so a shape refused alone in this pass stays
        # refused for the rest of it (a gang's member was refused beside its siblings'
        # tentative claims, which it gives back).
        known = self._refused.get(pod.requests)
        if known is not None:
            return known
        decision = choose(
            self.view, demand_of(pod.requests), self.held, granularity=self.granularity
        )
        if isinstance(decision, Choice):
            return _claim(pod, decision, self.now)
        reasons = {r.reason.value for r in decision.nofit.reasons if r.count} if decision else set()
        if alone:
            self._refused[pod.requests] = reasons
        return reasons

    def unit(self, unit: Sequence[SimPod], fair: FairWalk[tuple[SimPod, ...]]) -> None:
        namespace = unit[0].namespace
        quota = self.config.quota(namespace).cards
        least = sum(_least(p, self.granularity) for p in unit)
        if quota is not None and fair.held(namespace) + least > quota:
            self._refuse(unit, {QUOTA_EXCEEDED})
            return
        claims: list[Claim] = []
        for pod in unit:
            found = self._place(pod, alone=len(unit) == 1)
            if not isinstance(found, Claim):
                self._take_back(claims)
                self._refuse(unit, found)
                return
            self.held.add(found)
            claims.append(found)
        cards = sum(len(c.cards) for c in claims)
        if quota is not None and fair.held(namespace) + cards > quota:
            self._take_back(claims)
            self._refuse(unit, {QUOTA_EXCEEDED})
            return
        fair.took(namespace, cards)
        self.placed.extend(claims)

    def _take_back(self, claims: Iterable[Claim]) -> None:
        for claim in claims:
            self.held.remove(claim.server, claim.pod.uid)


def admission_pass(
    waiting: Sequence[SimPod],
    view: FleetView,
    held: Held,
    *,
    granularity: Granularity,
    config: QueueConfig,
    now: float,
) -> Pass:
    """Walk ``waiting`` (in arrival order) as admission does and place what fits; the
    claims are added to ``held`` and listed in ``placed``."""
    units = _units(waiting)
    namespace: Callable[[tuple[SimPod, ...]], str] = lambda u: u[0].namespace  # noqa: E731
    fair = FairWalk(
        units,
        namespace=namespace,
        priority=lambda u: 0,
        held=held.by_namespace(),
        config=config,
    )
    walk = Pass(view=view, held=held, granularity=granularity, config=config, now=now)
    for unit in fair:
        walk.unit(unit, fair)
    return walk
