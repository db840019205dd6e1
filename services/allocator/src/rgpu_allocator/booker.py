"""Both ways a pod gets a server — booked inside kube-scheduler's ``/filter`` (HAMi's flow) or
by admission before the pod reaches kube-scheduler — end in the same write: the chosen cards
become a claim in the server's Lease with compare-and-swap, and the fit is checked again on
the Lease as the apiserver holds it, so a choice made on the cache never double-books.

While the write is in flight the booking counts as held for every other decision in this
replica (``Pending``), so decisions made meanwhile spread over other servers.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace

from rgpu_contracts import Claim, ClaimState, ContainerRequest, PodRef
from rgpu_placement import Choice, Demand, assign, fit

from .claims import LeaseRecord
from .judging import Judge
from .leases import KEEP, Edited, LeaseWriter
from .policy import Policy

__all__ = ["Booked", "Booker"]

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Booker:
    """Turns a choice into a claim and writes it."""

    policy: Policy
    judge: Judge
    writer: LeaseWriter

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
        ledger = self.judge.ledger

        def change(record: LeaseRecord | None) -> Edited[Claim | None]:
            held = self.judge.occupancy(
                uid, leases=lambda s: record if s == server else ledger.lease(s)
            )
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
            self.judge.pending.hold(tentative),
        ):
            return await self.writer.edit(server, change, op="book")
