""" "is this claim still holding its cards?" decides double-booking on one side and leaked servers
on the other, so the rule (docs/design.md#validity) lives in exactly one place.

A claim is valid while its pod exists, has not finished, and is either bound or was booked /
committed less than the booking TTL ago (a booking made by admission: less than its own
admission TTL ago, committed or not — a Binding that fails sends the pod back through
kube-scheduler's queue, which that TTL is sized for, and a booking lost there would send the
retry through the filter path, past quotas, gangs and fair share). When the pod is missing
from the watch cache and the claim is older than the TTL, the answer is ``UNKNOWN``: the cache
may lag, so the claim keeps blocking until a fresh read of the pod confirms it is gone.
"""

from __future__ import annotations

import enum
from typing import Protocol

from rgpu_contracts import Claim, ClaimState

__all__ = ["PodFacts", "Validity", "claim_stamp", "claim_ttl", "expires_at", "judge", "lasting"]


class PodFacts(Protocol):
    """What the rule needs to know about a claim's pod (the allocator's ``PodInfo`` is one)."""

    @property
    def uid(self) -> str: ...

    @property
    def finished(self) -> bool:
        """Whether the pod is ``Succeeded`` or ``Failed``."""
        ...

    @property
    def bound(self) -> bool:
        """Whether the pod has ``spec.nodeName``."""
        ...


class Validity(enum.Enum):
    """The verdict on one claim."""

    VALID = "valid"
    INVALID = "invalid"
    UNKNOWN = "unknown"

    @property
    def blocks(self) -> bool:
        """Whether the claim still keeps its cards from other pods."""
        return self is not Validity.INVALID


def claim_stamp(claim: Claim) -> float:
    """When the claim's TTL window started: the commit if there was one, else the booking."""
    return claim.committed_at if claim.committed_at is not None else claim.booked_at


def claim_ttl(claim: Claim, ttl: float) -> float:
    """Seconds ``claim`` stays valid unbound (from ``claim_stamp``): an admitted booking's own
    TTL, else ``ttl`` (the booking TTL)."""
    if claim.admission_ttl is not None:
        return claim.admission_ttl
    return ttl


def expires_at(claim: Claim, pod: PodFacts | None, ttl: float) -> float | None:
    """When an unbound claim lapses; ``None`` once its pod is bound."""
    if claim.state is ClaimState.BOUND or (pod is not None and pod.bound):
        return None
    return claim_stamp(claim) + claim_ttl(claim, ttl)


def judge(
    claim: Claim, pod: PodFacts | None, *, now: float, ttl: float, gone: bool = False
) -> Validity:
    """Apply the validity rule to ``claim`` given the cached ``pod`` (``None`` if not cached).

    ``gone`` says the pod is known to be deleted (its deletion was seen, or a fresh read
    found nothing), which makes a missing pod's claim invalid rather than unknown.
    """
    fresh = now - claim_stamp(claim) < claim_ttl(claim, ttl)
    if pod is None and gone:
        return Validity.INVALID
    if pod is None:
        return Validity.VALID if fresh and claim.state is not ClaimState.BOUND else Validity.UNKNOWN
    if pod.uid != claim.pod.uid or pod.finished:
        return Validity.INVALID
    if pod.bound or fresh:
        return Validity.VALID
    return Validity.INVALID


def lasting(claim: Claim, pod: PodFacts | None) -> Validity | None:
    """``judge``'s verdict when no passing of time can change it, else ``None``: the cached
    pod finished or is another pod (invalid for good), or it is bound (valid until the pod
    changes). A caller may remember such a verdict for as long as ``pod`` stays the same."""
    if pod is None:
        return None
    if pod.uid != claim.pod.uid or pod.finished:
        return Validity.INVALID
    return Validity.VALID if pod.bound else None
