"""Two claims can name the same pod (replicas raced on it) or the same card (something lost
track); every replica and every dashboard must pick the same one, so the order lives here.

The most advanced state wins (bound, then committed, then booked): it is the one closest to a
running workload.
"""

from __future__ import annotations

from collections.abc import Iterable

from rgpu_contracts import Claim, ClaimState

__all__ = ["precedence", "state_rank", "winner"]

_RANK = {ClaimState.BOUND: 0, ClaimState.COMMITTED: 1, ClaimState.BOOKED: 2}


def state_rank(state: ClaimState) -> int:
    """0 for the most advanced claim state, larger for earlier ones."""
    return _RANK[state]


def precedence(claim: Claim) -> tuple[int, str]:
    """Sort key among one pod's claims: the most advanced state first, then server name."""
    return _RANK[claim.state], claim.server


def winner(claims: Iterable[Claim]) -> Claim | None:
    """The claim a pod keeps when it holds several (replicas raced on it). Every replica
    computes the same from the same data, so racing replicas converge."""
    return min(claims, key=precedence, default=None)
