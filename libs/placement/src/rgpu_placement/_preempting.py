"""When nothing fits because servers are held, an urgent pod may take a server from less
important work (DESIGN §11); which server, and which holders must go, has to be the same answer
on every replica, so the choice is a pure function here, next to choosing.

A server is a candidate when every holder that has to go has a lower priority than the pod,
and with them gone the pod fits. Candidates are ranked by the cost of freeing them: fewest
victims, then the lowest highest victim priority, then the least run time lost, then the
server name. In ``server`` granularity every holder of the server goes; in ``card``
granularity only the fewest holders whose cards make the request fit.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rgpu_contracts import CardId, Claim, ServerName, split_card_id

from ._demand import Demand
from ._fitting import Fit, Granularity, Holdings, fit
from ._fleetview import FleetView, ServerFacts

__all__ = ["MAX_SUBSETS", "Preemption", "Standing", "preemptions"]

MAX_SUBSETS = 4096
"""Victim sets tried per server in card granularity; a server has a handful of cards, so the
exact answer is found long before this, and a pathological server cannot stall a decision."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Standing:
    """What preempting needs to know about a holder's pod."""

    priority: int
    run_seconds: float
    """How long it has been running: the work lost if it is evicted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Preemption:
    """A server that fits once ``victims`` are gone, and what freeing it costs."""

    fit: Fit
    victims: tuple[Claim, ...]
    """The holders to evict, ordered by pod ``namespace/name``."""
    max_priority: int
    run_lost: float

    @property
    def server(self) -> ServerName:
        return self.fit.facts.name

    @property
    def cost(self) -> tuple[int, int, float, str]:
        return len(self.victims), self.max_priority, self.run_lost, self.server


StandingOf = Callable[[Claim], Standing | None]
"""A holder's standing, or ``None`` when it is unknown (such a holder is never a victim)."""


class _Evicted:
    """``held`` as if ``victims`` had left ``server`` (lupine's reports of their cards too)."""

    __slots__ = ("_cards", "_held", "_server", "_uids")

    def __init__(self, held: Holdings, server: str, victims: Sequence[Claim]) -> None:
        self._held = held
        self._server = server
        self._uids = {c.pod.uid for c in victims}
        self._cards = frozenset(card for c in victims for card in c.cards)

    def blocking(self, server: str) -> tuple[Claim, ...]:
        found = self._held.blocking(server)
        if server != self._server:
            return found
        return tuple(c for c in found if c.pod.uid not in self._uids)

    def problem(self, server: str) -> str | None:
        return self._held.problem(server)

    def taken(self, server: str) -> frozenset[CardId]:
        return frozenset(card for claim in self.blocking(server) for card in claim.cards)

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        busy = self._held.busy(facts)
        if facts.name != self._server or not busy:
            return busy
        return busy - {split_card_id(card)[1] for card in self._cards}

    def without_claims(self) -> Holdings:
        return self._held.without_claims()


def _option(
    facts: ServerFacts,
    demand: Demand,
    held: Holdings,
    victims: Sequence[tuple[Claim, Standing]],
    granularity: Granularity,
) -> Preemption | None:
    claims = [c for c, _ in victims]
    found = fit(facts, demand, _Evicted(held, facts.name, claims), granularity)
    if found is None:
        return None
    return Preemption(
        fit=found,
        victims=tuple(sorted(claims, key=lambda c: (c.pod.key, c.pod.uid))),
        max_priority=max(s.priority for _, s in victims),
        run_lost=sum(s.run_seconds for _, s in victims),
    )


def _cheapest_subset(
    facts: ServerFacts,
    demand: Demand,
    held: Holdings,
    movable: Sequence[tuple[Claim, Standing]],
) -> Preemption | None:
    tried = 0
    for size in range(1, len(movable) + 1):
        best: Preemption | None = None
        for subset in itertools.combinations(movable, size):
            tried += 1
            if tried > MAX_SUBSETS:
                return best
            found = _option(facts, demand, held, subset, "card")
            if found is not None and (best is None or found.cost < best.cost):
                best = found
        if best is not None:
            return best
    return None


def _movable(
    blockers: Sequence[Claim], priority: int, standing: StandingOf
) -> list[tuple[Claim, Standing]]:
    """The holders of lower priority than ``priority``, with their standing."""
    found: list[tuple[Claim, Standing]] = []
    for claim in blockers:
        s = standing(claim)
        if s is not None and s.priority < priority:
            found.append((claim, s))
    return found


def _for_server(
    facts: ServerFacts,
    demand: Demand,
    held: Holdings,
    priority: int,
    standing: StandingOf,
    granularity: Granularity,
) -> Preemption | None:
    blockers = held.blocking(facts.name)
    if facts.problem or held.problem(facts.name) or not blockers:
        return None
    movable = _movable(blockers, priority, standing)
    if granularity == "server":
        if len(movable) < len(blockers):
            return None
        return _option(facts, demand, held, movable, "server")
    return _cheapest_subset(facts, demand, held, movable)


def preemptions(
    view: FleetView,
    demand: Demand,
    held: Holdings,
    *,
    priority: int,
    standing: StandingOf,
    granularity: Granularity = "server",
) -> tuple[Preemption, ...]:
    """Every server a pod of ``priority`` could get by evicting lower-priority holders,
    cheapest first; empty when the pod has no priority or nothing can be freed for it."""
    if priority <= 0:
        return ()
    found = (_for_server(f, demand, held, priority, standing, granularity) for f in view.order)
    return tuple(sorted((p for p in found if p is not None), key=lambda p: p.cost))
