"""A decision judges the servers in best-fit order until one fits, and in a burst the first
hundreds are held by pods admitted and not yet bound: each decision would judge each of them
again, though their verdicts only change when a Lease or a pod changes, or a booking's TTL runs
out. ``Settled`` remembers them for every decision of one replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from rgpu_contracts import Claim
from rgpu_placement import Validity, expires_at, lasting

from .claims import LeaseRecord
from .pods import PodInfo

__all__ = ["SETTLED_KEPT", "Settled"]


def _unchanged(
    record: LeaseRecord, seen: tuple[PodInfo | None, ...], pods: Mapping[str, PodInfo]
) -> bool:
    """Whether every claim's pod is still the object ``seen`` when it was judged."""
    for claim, pod in zip(record.claims, seen, strict=True):
        if pods.get(claim.pod.uid) is not pod:
            return False
    return True


SETTLED_KEPT = 65_536
"""Servers ``Settled`` remembers; past it the memo starts over (bounded)."""


class Settled:
    """Per server, the stored claims that hold its cards, remembered for the Lease version and
    the pod states they were judged on, until the first of them could lapse.

    The memo is keyed on the Lease record and on each claim's pod object (both
    immutable and replaced on change), so a change to either is a miss, never a stale answer,
    and it holds until the earliest lapse among the fresh bookings it counted. Claims whose
    pod is not in the cache, and servers holding a booking already past its TTL (whose verdict
    depends on how far the cache is trusted), are never remembered.
    """

    __slots__ = ("_found",)

    def __init__(self) -> None:
        self._found: dict[str, _Memo] = {}

    def holding(
        self, record: LeaseRecord, pods: Mapping[str, PodInfo], now: float, ttl: float
    ) -> tuple[Claim, ...] | None:
        """The claims of ``record`` that hold their cards at ``now``, if that can be told
        without the cache's trust; ``None`` when it cannot."""
        found = self._found.get(record.server)
        if (
            found is not None
            and found.record is record
            and now < found.until
            and _unchanged(record, found.seen, pods)
        ):
            return found.holding
        memo = _judged(record, pods, now, ttl)
        if memo is None:
            return None
        if len(self._found) >= SETTLED_KEPT:
            self._found.clear()
        self._found[record.server] = memo
        return memo.holding


@dataclass(frozen=True, slots=True)
class _Memo:
    record: LeaseRecord
    seen: tuple[PodInfo | None, ...]
    holding: tuple[Claim, ...]
    until: float
    """When the first fresh booking counted in ``holding`` lapses (``inf``: none)."""


def _judged(
    record: LeaseRecord, pods: Mapping[str, PodInfo], now: float, ttl: float
) -> _Memo | None:
    seen = tuple(pods.get(c.pod.uid) for c in record.claims)
    holding: list[Claim] = []
    until = math.inf
    for claim, pod in zip(record.claims, seen, strict=True):
        verdict = lasting(claim, pod)
        if verdict is None:
            lapses = expires_at(claim, pod, ttl) if pod is not None else None
            if lapses is None or now >= lapses:
                return None
            until, verdict = min(until, lapses), Validity.VALID
        if verdict is Validity.VALID:
            holding.append(claim)
    return _Memo(record=record, seen=seen, holding=tuple(holding), until=until)
