"""What the allocator does in the background is a reaction to something it saw: capacity freed,
a pod changed, a claim needing a look, leadership moving. Which activity hears which event is
the allocator's wiring, and a reader should find it in one table (``parts.reactions``), not
spread over lambdas in a composition root.

``Signals`` is that table's switchboard: components are built with its methods as their
callbacks, and the table connects each signal to its handlers afterwards, so no component
needs to exist before the ones it notifies.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence

from rgpu_contracts import Claim

from .pods import PodInfo

__all__ = ["Signal", "Signals"]

PodHandler = Callable[[PodInfo | None, PodInfo | None], None]


class Signal(enum.Enum):
    """The events background work reacts to."""

    CAPACITY_FREED = "capacity freed"
    """Cards were released, a server appeared or became usable: waiting pods may fit now."""
    POD_CHANGED = "pod changed"
    """The pod watch delivered a change (before, after); ``after`` is ``None`` on deletion."""
    CLAIMS_TOUCHED = "claims touched"
    """A pod's claims need a look (duplicated across servers, or their Lease deleted)."""
    LEADERSHIP = "leadership"
    """This replica started (``True``) or stopped (``False``) leading."""
    ADMISSION_LAPSED = "admission lapsed"
    """An admitted pod's booking lapsed before the pod was bound (the claim, as removed)."""


class Signals:
    """Fans each signal out to the handlers connected to it; every method is sync-callable."""

    __slots__ = ("_freed", "_lapsed", "_leadership", "_pods", "_touched")

    def __init__(self) -> None:
        self._freed: tuple[Callable[[], None], ...] = ()
        self._pods: tuple[PodHandler, ...] = ()
        self._touched: tuple[Callable[[str], None], ...] = ()
        self._leadership: tuple[Callable[[bool], None], ...] = ()
        self._lapsed: tuple[Callable[[Claim], None], ...] = ()

    def connect(self, table: Mapping[Signal, Sequence[Callable[..., None]]]) -> None:
        """Connect every signal of ``table`` to its handlers (replacing any before)."""
        self._freed = tuple(table.get(Signal.CAPACITY_FREED, ()))
        self._pods = tuple(table.get(Signal.POD_CHANGED, ()))
        self._touched = tuple(table.get(Signal.CLAIMS_TOUCHED, ()))
        self._leadership = tuple(table.get(Signal.LEADERSHIP, ()))
        self._lapsed = tuple(table.get(Signal.ADMISSION_LAPSED, ()))

    def capacity_freed(self) -> None:
        for handler in self._freed:
            handler()

    def pod_changed(self, before: PodInfo | None, after: PodInfo | None) -> None:
        for handler in self._pods:
            handler(before, after)

    def claims_touched(self, uid: str) -> None:
        for handler in self._touched:
            handler(uid)

    def leadership(self, leading: bool) -> None:
        for handler in self._leadership:
            handler(leading)

    def admission_lapsed(self, claim: Claim) -> None:
        for handler in self._lapsed:
            handler(claim)
