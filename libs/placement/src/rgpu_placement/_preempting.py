"""When nothing fits because servers are held, an urgent pod may take a server from less important
work (docs/design.md §11); which server, and which holders must go, has to be the same answer on
every replica, so the choice is a pure function here, next to choosing.

A server is a candidate when every holder that has to go has a lower priority than the pod,
and with them gone the pod fits. Candidates are ranked by the cost of freeing them: fewest
victims, then the lowest highest victim priority, then the least run time lost, then the
server name. In ``server`` granularity every holder of the server goes; in ``card``
granularity only the fewest holders whose cards make the request fit.

While the victims terminate, the freed cards are promised to the pod by a ``Nomination``
stored on the server's Lease (annotation ``rgpu.io/nomination``); every replica, and
``rgpu explain``, reads the same record. It holds the cards for everyone of lower or equal
priority until the nominee books, goes away, or the nomination expires.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rgpu_contracts import (
    CardId,
    Claim,
    ClaimState,
    ContractError,
    PodRef,
    ServerName,
    split_card_id,
)

from ._demand import Demand
from ._fitting import Fit, Granularity, Holdings, fit
from ._fleetview import FleetView, ServerFacts

__all__ = [
    "ANNOTATION_NOMINATION",
    "MAX_SUBSETS",
    "Nomination",
    "Preemption",
    "Standing",
    "preemptions",
]

ANNOTATION_NOMINATION = "rgpu.io/nomination"
"""The Lease annotation that stores a server's ``Nomination`` (JSON object)."""

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


def _number(raw: Mapping[str, object], key: str, path: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractError(f"{path}.{key}", "expected a number")
    return float(value)


def _list(raw: Mapping[str, object], key: str, path: str) -> list[object]:
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise ContractError(f"{path}.{key}", "expected a JSON array")
    return value


def _card(raw: object, path: str) -> CardId:
    if not isinstance(raw, str) or not raw:
        raise ContractError(path, "expected a card id string")
    return CardId(raw)


@dataclass(frozen=True, slots=True, kw_only=True)
class Nomination:
    """A server's cards promised to ``pod`` while its ``victims`` terminate."""

    pod: PodRef
    priority: int
    cards: tuple[CardId, ...]
    """The cards the pod will get (every healthy card in server granularity)."""
    victims: tuple[PodRef, ...]
    nominated_at: float
    expires_at: float
    """Booking TTL plus the victims' longest grace period after ``nominated_at``."""

    def holds_against(self, uid: str, priority: int, now: float) -> bool:
        """Whether the promise keeps pod ``uid`` of ``priority`` off these cards at ``now``."""
        return now < self.expires_at and uid != self.pod.uid and priority <= self.priority

    def as_claim(self, server: ServerName) -> Claim:
        """The promise in the shape the fit checks read: the nominee holding its cards."""
        return Claim(
            pod=self.pod,
            server=server,
            cards=self.cards,
            containers=(),
            state=ClaimState.BOOKED,
            booked_at=self.nominated_at,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "pod": dict(self.pod.to_dict()),
            "priority": self.priority,
            "cards": list(self.cards),
            "victims": [dict(v.to_dict()) for v in self.victims],
            "nominatedAt": self.nominated_at,
            "expiresAt": self.expires_at,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "nomination") -> Nomination:
        """Read a stored nomination; raises ``ContractError`` naming the bad field."""
        if not isinstance(raw, Mapping):
            raise ContractError(path, "expected a JSON object")
        priority = raw.get("priority")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ContractError(f"{path}.priority", "expected an integer")
        victims = _list(raw, "victims", path)
        cards = _list(raw, "cards", path)
        return cls(
            pod=PodRef.from_dict(raw.get("pod"), f"{path}.pod"),
            priority=priority,
            cards=tuple(_card(c, f"{path}.cards[{i}]") for i, c in enumerate(cards)),
            victims=tuple(
                PodRef.from_dict(v, f"{path}.victims[{i}]") for i, v in enumerate(victims)
            ),
            nominated_at=_number(raw, "nominatedAt", path),
            expires_at=_number(raw, "expiresAt", path),
        )


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
