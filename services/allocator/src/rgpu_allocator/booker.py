"""Both ways a pod gets a server — booked inside kube-scheduler's ``/filter`` (HAMi's flow) or
by admission before the pod reaches kube-scheduler — end in the same write: the chosen cards
become a claim in the server's Lease with compare-and-swap, and the fit is checked again on
the Lease as the apiserver holds it, so a choice made on the cache never double-books.

Inside one replica many requests are decided at once, every decision deterministic: without
care a burst of pods all choose the same best server and lose the compare-and-swap to each
other one by one. So a booking being written counts as held for every other decision in this
replica until the write ends (``Pending``; kube-scheduler "assumes" pods the same way), and
concurrent decisions spread over different servers; across replicas, compare-and-swap still
decides. An admission pass keeps the bookings it plans in a ``Pending`` of its own, which its
decisions count over those in flight.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType

from opentelemetry import trace

from rgpu_contracts import Claim, ClaimState, ContainerRequest, PodRef, PodUID
from rgpu_placement import Choice, Demand, assign, cards_by_namespace, fit

from .claims import LeaseRecord
from .judging import Judge
from .leases import KEEP, Edited, LeaseWriter
from .occupancy import Occupancy
from .policy import Policy

__all__ = ["Booked", "Booker", "Pending"]

tracer = trace.get_tracer(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Booked:
    """What is being booked: for whom, what they ask, and what was chosen."""

    pod: PodRef
    containers: tuple[ContainerRequest, ...]
    demand: Demand
    choice: Choice
    admission_ttl: float | None = None
    """Set when admission books (the claim then lives by its own TTL until committed)."""
    seen: Occupancy | None = None
    """Who held what when the choice was made: the write re-fits on it, with the Lease as
    read (``None``: judged afresh when the write starts)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Booker:
    """Turns a choice into a claim and writes it."""

    policy: Policy
    judge: Judge
    writer: LeaseWriter
    pending: Pending
    """This replica's bookings in flight (the judge reads the same table)."""

    def claim(self, booked: Booked, choice: Choice, now: float) -> Claim:
        """The claim ``booked`` would hold with the cards of ``choice``."""
        facts = choice.fit.facts
        return Claim(
            pod=booked.pod,
            server=facts.name,
            cards=tuple(c.id for c in sorted(choice.fit.cards, key=lambda c: (c.index, c.id))),
            containers=assign(booked.containers, choice.fit.cards, self.policy.granularity),
            state=ClaimState.BOOKED,
            booked_at=now,
            admission_ttl=booked.admission_ttl,
        )

    async def book(self, booked: Booked) -> Claim | None:
        """Write the booking, re-checking the fit on the Lease as read; ``None`` if it was lost.

        Raises ``LeaseUnreadable``, ``Contended`` and ``KubeUnavailable`` as ``LeaseWriter.edit``.
        """
        uid = booked.pod.uid
        server = booked.choice.fit.facts.name
        now = self.judge.clock()
        seen = booked.seen if booked.seen is not None else self.judge.occupancy(uid)

        def change(record: LeaseRecord | None) -> Edited[Claim | None]:
            held = seen.with_lease(server, record)
            found = fit(booked.choice.fit.facts, booked.demand, held, self.policy.granularity)
            if found is None:
                return Edited(None, None)
            claim = self.claim(booked, Choice(fit=found, tier=booked.choice.tier), now)
            others = record.claims if record is not None else ()
            keep = tuple(c for c in others if c.pod.uid != uid and held.validity(c).blocks)
            promised = record.nomination if record is not None else None
            # The nominee's booking is what its nomination waited for: it ends here.
            mine = promised is not None and promised.pod.uid == uid
            return Edited((*keep, claim), claim, nomination=None if mine else KEEP)

        # Registered before the first await: concurrent decisions in this replica see it at once.
        tentative = self.claim(booked, booked.choice, now)
        attributes = {"rgpu.server": server, "k8s.pod.uid": uid}
        with (
            tracer.start_as_current_span("book", attributes=attributes),
            self.pending.hold(tentative),
        ):
            return await self.writer.edit(server, change, op="book")


class Pending:
    """Bookings of this replica whose Lease write is in flight, per server."""

    __slots__ = ("_by_server", "by_server")

    def __init__(self) -> None:
        self._by_server: dict[str, dict[PodUID, Claim]] = {}
        self.by_server: Mapping[str, Mapping[PodUID, Claim]] = MappingProxyType(self._by_server)
        """The bookings in flight per server, read-only (what a decision's Occupancy reads)."""

    def cards_by_namespace(self) -> dict[str, int]:
        """Cards of the bookings in flight, per pod namespace (quotas count them as held)."""
        return cards_by_namespace(c for held in self._by_server.values() for c in held.values())

    def add(self, claim: Claim) -> None:
        """Count ``claim`` as held until ``discard``."""
        self._by_server.setdefault(claim.server, {})[claim.pod.uid] = claim

    def discard(self, claim: Claim) -> None:
        """Stop counting ``claim`` (its write ended, whichever way)."""
        held = self._by_server.get(claim.server, {})
        held.pop(claim.pod.uid, None)
        if not held:
            self._by_server.pop(claim.server, None)

    @contextmanager
    def hold(self, claim: Claim) -> Iterator[None]:
        """Count ``claim`` as held while the block runs."""
        self.add(claim)
        try:
            yield
        finally:
            self.discard(claim)
