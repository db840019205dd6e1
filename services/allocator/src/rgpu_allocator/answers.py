"""What the allocator answers about a claim (``Allocation``: server, endpoint, cards, when an
unbound booking lapses) is the same for a booking, a commit and a lookup: written once here.
"""

from __future__ import annotations

from dataclasses import dataclass

from rgpu_contracts import Allocation, Claim
from rgpu_placement import expires_at

from .judging import Judge
from .policy import Policy

__all__ = ["Answers"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Answers:
    """The API's view of claims."""

    policy: Policy
    judge: Judge

    def allocation_of(
        self, claim: Claim, annotations: tuple[tuple[str, str], ...] = ()
    ) -> Allocation:
        """The API view of ``claim``."""
        view = self.judge.discovery.view
        facts = view.facts.get(claim.server) if view is not None else None
        endpoint = facts.server.endpoint if facts is not None else None
        pod = self.judge.pods.by_uid.get(claim.pod.uid)
        return Allocation(
            pod=claim.pod,
            server=claim.server,
            endpoint=endpoint or "",
            cards=claim.cards,
            containers=claim.containers,
            state=claim.state,
            booked_at=claim.booked_at,
            expires_at=expires_at(claim, pod, self.policy.ttl),
            annotations=annotations,
        )
