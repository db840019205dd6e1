"""A pod that can never be admitted on the fleet as it is (a request larger than any server, a
gang of more members than servers that could take one) must be told so, once, in words that
name the largest server; working that out builds an idle copy of the fleet, so it is
remembered per fleet and request shape (``rgpu_placement.never_fits``).
"""

from __future__ import annotations

from rgpu_contracts import Fleet
from rgpu_placement import Demand, Granularity, capable_servers, never_fits

__all__ = ["KEPT", "Capacity"]

KEPT = 256
"""Shapes remembered per fleet; past it the memo starts over (bounded)."""


class Capacity:
    """``never_fits`` per fleet and shape, remembered."""

    __slots__ = ("_fleet", "_memo")

    def __init__(self) -> None:
        self._fleet: Fleet | None = None
        self._memo: dict[tuple[object, str, int], str | None] = {}

    def never(
        self, fleet: Fleet, demand: Demand, granularity: Granularity, size: int
    ) -> str | None:
        """Why ``size`` pods of ``demand`` can never be admitted together, or ``None``."""
        if fleet is not self._fleet or len(self._memo) >= KEPT:
            self._fleet, self._memo = fleet, {}
        key = (demand.shape(granularity), granularity, size)
        if key not in self._memo:
            self._memo[key] = _never(fleet, demand, granularity, size)
        return self._memo[key]


def _never(fleet: Fleet, demand: Demand, granularity: Granularity, size: int) -> str | None:
    found = never_fits(fleet, demand, granularity)
    if found is not None:
        return found.line
    if size <= 1 or granularity == "card":
        return None
    capable = capable_servers(fleet, demand, granularity)
    if size <= capable:
        return None
    return (
        f"never fits: the gang has {size} members and only {capable} server(s) of the fleet "
        "could ever take one (each member holds a whole server)"
    )
