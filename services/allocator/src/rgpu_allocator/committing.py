"""A commit turns a pod's booking into the Binding's annotations, at ``/bind``: it honours
only a booking that is still valid and still exclusively the pod's, judged on the Lease as the
apiserver holds it, and it finds the booking even when another replica made it a moment ago
and this replica's Lease watch has not delivered that write yet (``leases.Finder``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from opentelemetry import trace

from rgpu_contracts import Allocation, Claim, ClaimState, NodeName
from rgpu_placement import FleetView, Validity, winner

from .annotations import binding_annotations
from .answers import Answers
from .claims import LeaseRecord
from .errors import BookingExpired, CardsGone, ClaimNotFound, ServerTaken
from .judging import Judge
from .leases import Edited, Finder, LeaseWriter
from .policy import Policy
from .removal import Remover

__all__ = ["Committer"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Committer:
    """The commit of ``/bind``."""

    policy: Policy
    judge: Judge
    writer: LeaseWriter
    finder: Finder
    remover: Remover
    answers: Answers

    async def commit(self, uid: str, node: str) -> Allocation:
        """Commit ``uid``'s booking for ``node`` and return the Binding's annotations.

        Raises ``ClaimNotFound`` (no claim), ``BookingExpired`` (lapsed), ``ServerTaken`` (another
        pod holds the cards), ``CardsGone`` (cards left the fleet) and ``KubeUnavailable``.
        """
        view = self.judge.view()
        attributes = {"k8s.pod.uid": uid, "k8s.node.name": node}
        with tracer.start_as_current_span("commit", attributes=attributes):
            claims = await self.finder.claims(uid)
            target = winner(c for c in claims if self.judge.validity(c).blocks) or winner(claims)
            if target is None:
                raise ClaimNotFound(f"no claim for pod uid {uid}; book it first")
            annotations = self._annotations(view, target)
            committed = await self.writer.edit(
                target.server, lambda record: self._committed(uid, node, record), op="commit"
            )
            await self.remover.settle(uid)
        logger.info("committed %s on %s for node %s", target.pod.key, target.server, node)
        return self.answers.allocation_of(committed, annotations)

    def _annotations(self, view: FleetView, target: Claim) -> tuple[tuple[str, str], ...]:
        facts = view.facts.get(target.server)
        endpoint = facts.server.endpoint if facts is not None else None
        if not endpoint:
            raise CardsGone(f"{target.server} has no lupine endpoint now; filter the pod again")
        return binding_annotations(
            target, endpoint=endpoint, cards=view.cards, granularity=self.policy.granularity
        )

    def _committed(self, uid: str, node: str, record: LeaseRecord | None) -> Edited[Claim]:
        """The commit, judged on the claim as found in ``record`` (the Lease as read)."""
        claim = record.claim_of(uid) if record is not None else None
        if record is None or claim is None:
            raise ClaimNotFound(f"the claim of pod uid {uid} was released; filter the pod again")
        if self.judge.validity(claim) is not Validity.VALID:
            raise BookingExpired(
                f"the booking of {claim.pod.key} on {claim.server} expired "
                f"(older than {self.policy.ttl:g} s); filter the pod again"
            )
        held = self.judge.occupancy(uid).with_lease(claim.server, record)
        taken = held.taken(claim.server)
        if held.blocking(claim.server) and (
            self.policy.granularity == "server" or taken & set(claim.cards)
        ):
            raise ServerTaken(f"{claim.server} is held by another pod; filter the pod again")
        state = ClaimState.BOUND if claim.state is ClaimState.BOUND else ClaimState.COMMITTED
        committed = dataclasses.replace(
            claim, state=state, committed_at=self.judge.clock(), node=NodeName(node)
        )
        return Edited((*record.without(uid), committed), committed)
