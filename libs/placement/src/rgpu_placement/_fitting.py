""" "can this server take this pod?" has two answers in two granularities
(docs/design.md#choosing-a-server), and when the answer is no, HAMi-compatible reasons per card.

The fast checks (``fit``) run for every server tried and must stay cheap; the verdicts
(``verdict``) run only when nothing fits, to explain why, card by card.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal, Protocol

from rgpu_contracts import Card, CardId, Claim, Reason, ReasonCount, ServerVerdict

from ._demand import Demand
from ._fleetview import ServerFacts

__all__ = ["BusyIgnored", "Fit", "Granularity", "Holdings", "Unclaimed", "fit", "verdict"]

Granularity = Literal["server", "card"]


class Holdings(Protocol):
    """Who else holds cards, as the fit checks need it (the allocator's ``Occupancy`` reads it
    from the claim Leases; ``rgpu simulate`` keeps its own)."""

    def blocking(self, server: str) -> tuple[Claim, ...]: ...

    def problem(self, server: str) -> str | None:
        """Why the whole server counts as held whatever its claims say (a full sentence:
        unreadable claims, or kept for another pod), or ``None``."""
        ...

    def taken(self, server: str) -> frozenset[CardId]: ...

    def busy(self, facts: ServerFacts) -> frozenset[str]: ...

    def without_claims(self) -> Holdings: ...


class Unclaimed:
    """Holdings of a cluster with no claims at all; every busy report counts."""

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return ()

    def problem(self, server: str) -> str | None:
        return None

    def taken(self, server: str) -> frozenset[CardId]:
        return frozenset()

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return facts.busy

    def without_claims(self) -> Unclaimed:
        return self


class BusyIgnored:
    """``held`` as if lupine reported no client anywhere: which servers only busy reports keep
    from a pod (those are worth asking discovery to probe again)."""

    __slots__ = ("_held",)

    def __init__(self, held: Holdings) -> None:
        self._held = held

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return self._held.blocking(server)

    def problem(self, server: str) -> str | None:
        return self._held.problem(server)

    def taken(self, server: str) -> frozenset[CardId]:
        return self._held.taken(server)

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return frozenset()

    def without_claims(self) -> Holdings:
        return BusyIgnored(self._held.without_claims())


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """A server that can take the pod, the cards it would get, and its best-fit weight."""

    facts: ServerFacts
    cards: tuple[Card, ...]
    weight: int
    """Cards that satisfy the request on this server; fewer is a tighter (better) fit."""


def _wrong_cuda(f: ServerFacts, demand: Demand) -> bool:
    """The pod asks for a CUDA major this server's lupine does not report (or not yet)."""
    return demand.cuda_major is not None and f.cuda_major != demand.cuda_major


def _fit_server(f: ServerFacts, demand: Demand, held: Holdings) -> Fit | None:
    if f.problem or not f.healthy or held.problem(f.name) or held.blocking(f.name):
        return None
    # A pod given the whole server sees every card of it, a cordoned one too.
    if f.cordoned or _wrong_cuda(f, demand):
        return None
    if held.busy(f):
        return None
    if any(f.capable(ask.memory_mib) < ask.count for ask in demand.asks):
        return None
    return Fit(facts=f, cards=f.healthy, weight=len(f.healthy))


def _free_capable(f: ServerFacts, demand: Demand, held: Holdings) -> list[Card]:
    start = len(f.memories) - f.capable(demand.max_memory_mib)
    taken = held.taken(f.name)
    busy = held.busy(f)
    cordoned = f.cordoned
    return [
        c
        for c in f.healthy[start:]
        if c.id not in taken and c.uuid not in busy and c.uuid not in cordoned
    ]


def _fit_card(f: ServerFacts, demand: Demand, held: Holdings) -> Fit | None:
    if f.problem or held.problem(f.name) or _wrong_cuda(f, demand):
        return None
    free = _free_capable(f, demand, held)
    if len(free) < demand.effective_count:
        return None
    return Fit(facts=f, cards=tuple(free[: demand.effective_count]), weight=len(free))


def fit(f: ServerFacts, demand: Demand, held: Holdings, granularity: Granularity) -> Fit | None:
    """The fit of ``f`` for ``demand`` given ``held``, or ``None`` when it cannot take the pod."""
    check = _fit_server if granularity == "server" else _fit_card
    return check(f, demand, held)


def _holders(claims: tuple[Claim, ...]) -> str:
    pods = sorted({f"{c.pod.namespace}/{c.pod.name}" for c in claims})
    return ", ".join(pods)


def _blocked(f: ServerFacts, held: Holdings) -> tuple[Reason, str] | None:
    """Server granularity: why the whole server is taken, if it is."""
    problem = held.problem(f.name)
    if problem:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, problem
    blockers = held.blocking(f.name)
    if blockers:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, f"held by {_holders(blockers)}"
    busy = held.busy(f)
    if busy:
        return Reason.CARD_BUSY_ON_SERVER, f"lupine reports clients on {', '.join(sorted(busy))}"
    return None


def _short_asks(f: ServerFacts, demand: Demand) -> str:
    short = [a for a in demand.asks if f.capable(a.memory_mib) < a.count]
    if not short:
        return ""
    a = short[0]
    return (
        f"a container needs {a.count} card(s) with >= {a.memory_mib} MiB; "
        f"{f.capable(a.memory_mib)} healthy card(s) qualify"
    )


def _server_verdict(f: ServerFacts, demand: Demand, held: Holdings) -> tuple[Counter[Reason], str]:
    counts: Counter[Reason] = Counter()
    unhealthy = len(f.server.cards) - len(f.healthy)
    counts[Reason.CARD_NOT_HEALTH] += unhealthy
    blocked = _blocked(f, held)
    if blocked is not None:
        counts[blocked[0]] += len(f.healthy)
        return counts, blocked[1]
    counts[Reason.CARD_INSUFFICIENT_MEMORY] += len(f.healthy) - f.capable(demand.max_memory_mib)
    detail = _short_asks(f, demand)
    if detail or not f.healthy:
        counts[Reason.NODE_INSUFFICIENT_DEVICE] += 1
    return counts, detail or "no healthy card"


def _card_reason(
    card: Card, busy: frozenset[str], need: int, taken: frozenset[CardId]
) -> Reason | None:
    if not card.healthy:
        return Reason.CARD_NOT_HEALTH
    if card.cordoned:
        return Reason.CARD_CORDONED
    if card.id in taken:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if card.uuid in busy:
        return Reason.CARD_BUSY_ON_SERVER
    if card.memory_mib < need:
        return Reason.CARD_INSUFFICIENT_MEMORY
    return None


def _card_verdict(f: ServerFacts, demand: Demand, held: Holdings) -> tuple[Counter[Reason], str]:
    problem = held.problem(f.name)
    if problem:
        counts = Counter({Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: len(f.server.cards)})
        return counts, problem
    taken = held.taken(f.name)
    busy = held.busy(f)
    found = (_card_reason(c, busy, demand.max_memory_mib, taken) for c in f.server.cards)
    counts = Counter(r for r in found if r is not None)
    usable = len(f.server.cards) - sum(counts.values())
    counts[Reason.NODE_INSUFFICIENT_DEVICE] += 1
    blockers = held.blocking(f.name)
    holders = f"; held by {_holders(blockers)}" if blockers else ""
    return counts, f"{usable} usable card(s), {demand.effective_count} needed{holders}"


def _cuda_detail(f: ServerFacts, demand: Demand) -> str:
    reported = f.server.cuda_version
    said = f"lupine reports CUDA {reported}" if reported else "lupine's CUDA version is not known"
    return f"{said}; the pod asks for CUDA {demand.cuda_major}"


def verdict(
    f: ServerFacts, demand: Demand, held: Holdings, granularity: Granularity
) -> ServerVerdict:
    """Why ``f`` cannot take the pod: counts per card (per server for NodeInsufficientDevice)."""
    if f.problem is not None:
        counts: Counter[Reason] = Counter({f.problem: len(f.server.cards)})
        detail = f.detail
    elif _wrong_cuda(f, demand):
        counts = Counter({Reason.CUDA_VERSION_MISMATCH: len(f.server.cards)})
        detail = _cuda_detail(f, demand)
    elif granularity == "server" and f.cordoned:
        counts = Counter({Reason.SERVER_CORDONED: len(f.server.cards)})
        cards = ", ".join(sorted(f.cordoned))
        detail = f"card(s) {cards} cordoned; the whole server would be booked"
    elif granularity == "server":
        counts, detail = _server_verdict(f, demand, held)
    else:
        counts, detail = _card_verdict(f, demand, held)
    reasons = tuple(
        ReasonCount(reason=r, count=n)
        for r, n in sorted(counts.items(), key=lambda i: i[0].value)
        if n
    )
    return ServerVerdict(server=f.name, reasons=reasons, detail=detail)
