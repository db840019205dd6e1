"""Some requests no server can ever satisfy (16 cards on 4-card servers, 100 GiB per card on
80 GiB cards): such a pod waits forever however long its turn takes, and ``rgpu explain`` and
``rgpu simulate`` must say so in one line instead of listing what currently holds each server.

"Ever" means with the hardware as it is: every server ready and reachable, every card
healthy, nothing held and no lupine client anywhere. The placement rules the allocator decides
with (``rgpu_placement.choose``) are asked once against that fleet: a refusal there is final.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rgpu_contracts import ContainerRequest, Fleet, NoFit
from rgpu_placement import FleetView, Granularity, Refusal, Unclaimed, choose, demand_of

__all__ = ["NeverFits", "never_fits"]

_SHOWN = 3
"""Distinct per-server details shown before "and N more"."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NeverFits:
    """Why a request cannot fit any server of the fleet, even an idle and healthy one."""

    nofit: NoFit
    servers: int

    @property
    def line(self) -> str:
        """One line: the reason each server gives (grouped), and what would help."""
        details = Counter(v.detail for v in self.nofit.servers if v.detail)
        if len(details) == 1:
            (detail,) = details
            where = f"{detail} on every one of the {self.servers} servers"
        else:
            shown = [f"{d} ({n} servers)" for d, n in details.most_common(_SHOWN)]
            rest = len(details) - len(shown)
            where = "; ".join(shown) + (f"; and {rest} more" if rest > 0 else "")
        where = where or self.nofit.message
        return (
            f"never fits: no server can satisfy this request even when idle and healthy "
            f"({self.nofit.message}): {where}; ask for less, or add larger servers"
        )


def _idle(fleet: Fleet) -> Fleet:
    servers = tuple(
        replace(
            server,
            ready=True,
            reachable=True,
            busy=frozenset(),
            cards=tuple(replace(card, healthy=True) for card in server.cards),
        )
        for server in fleet.servers
    )
    return replace(fleet, servers=servers)


def never_fits(
    fleet: Fleet, requests: Sequence[ContainerRequest], granularity: Granularity
) -> NeverFits | None:
    """Why ``requests`` can fit no server of ``fleet`` ever, or None when some server could."""
    if not fleet.servers:
        return None  # an empty fleet says nothing about sizes: servers may yet join
    view = FleetView.build(_idle(fleet), None, ())
    decision = choose(view, demand_of(tuple(requests)), Unclaimed(), granularity=granularity)
    if not isinstance(decision, Refusal):
        return None
    return NeverFits(nofit=decision.nofit, servers=len(fleet.servers))
