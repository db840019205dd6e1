"""What one admission pass learns as it walks the gated pods in order (``Pass``: the bookings it
planned, the shapes it refused, the servers it keeps for waiting pods of higher priority), and
the holdings a pod later in line sees (``Reserved``: a server kept for a pod that outranks it
counts as unusable, so asks behind cannot nibble at it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rgpu_contracts import CardId, Claim, ServerName
from rgpu_placement import FairWalk, Holdings, ServerFacts

from .booker import Pending
from .units import Unit
from .verdicts import Verdict

__all__ = ["Pass", "Reserved"]


@dataclass(slots=True)
class Pass:
    """What one walk has learnt so far."""

    pending: Pending
    """The bookings planned so far (held for the pods after them, besides those in flight)."""
    fair: FairWalk[Unit]
    refused: dict[object, Verdict] = field(default_factory=dict)
    reserved: dict[ServerName, int] = field(default_factory=dict)
    admitted: int = 0


class Reserved:
    """``held`` with the servers kept for higher-priority pods marked unusable."""

    __slots__ = ("_held", "_priority", "_reserved")

    def __init__(self, held: Holdings, reserved: dict[ServerName, int], priority: int) -> None:
        self._held, self._reserved, self._priority = held, reserved, priority

    @property
    def unreserved(self) -> Holdings:
        return self._held

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return self._held.blocking(server)

    def problem(self, server: str) -> str | None:
        if self._reserved.get(ServerName(server), self._priority) > self._priority:
            return "kept for a waiting pod of higher priority"
        return self._held.problem(server)

    def taken(self, server: str) -> frozenset[CardId]:
        return self._held.taken(server)

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return self._held.busy(facts)

    def without_claims(self) -> Holdings:
        return Reserved(self._held.without_claims(), self._reserved, self._priority)
