"""Some requests no server can ever satisfy (16 cards on 4-card servers, 100 GiB per card on
80 GiB cards): such a pod waits forever however long its turn takes, and admission (its Event),
``rgpu explain`` and ``rgpu simulate`` must say so in one line, naming the largest server,
instead of listing what currently holds each server.

"Ever" means with the hardware as it is: every server ready, reachable and uncordoned, every
card healthy, nothing held and no lupine client anywhere. The placement rules (``choose``) are
asked once against that fleet: a refusal there is final, whatever frees later.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from rgpu_contracts import Fleet, NoFit, Server

from ._choosing import Refusal, choose
from ._demand import Demand
from ._fitting import Granularity, Unclaimed, fit
from ._fleetview import FleetView

__all__ = ["NeverFits", "capable_servers", "never_fits"]

_SHOWN = 3
"""Distinct per-server details shown before "and N more"."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NeverFits:
    """Why a request cannot fit any server of the fleet, even an idle and healthy one."""

    nofit: NoFit
    servers: int
    largest: Server
    """The server with the most cards (then the largest card): what the pod is up against."""

    @property
    def line(self) -> str:
        """One line: the reason each server gives (grouped), the largest server, the fix."""
        details = Counter(v.detail for v in self.nofit.servers if v.detail)
        if len(details) == 1:
            (detail,) = details
            where = f"{detail} on every one of the {self.servers} servers"
        else:
            shown = [f"{d} ({n} servers)" for d, n in details.most_common(_SHOWN)]
            rest = len(details) - len(shown)
            where = "; ".join(shown) + (f"; and {rest} more" if rest > 0 else "")
        where = where or self.nofit.message
        memory = max((c.memory_mib for c in self.largest.cards), default=0)
        largest = (
            f"the largest server, {self.largest.name}, has {len(self.largest.cards)} card(s) "
            f"of up to {memory} MiB"
        )
        return (
            f"never fits: no server can satisfy this request even when idle and healthy "
            f"({self.nofit.message}): {where}; {largest}; ask for less, or add larger servers"
        )


def _idle(server: Server) -> Server:
    cards = tuple(replace(card, healthy=True, cordoned=False) for card in server.cards)
    return replace(
        server, ready=True, reachable=True, cordoned=False, busy=frozenset(), cards=cards
    )


def _idle_view(fleet: Fleet) -> FleetView:
    return FleetView.build(replace(fleet, servers=tuple(_idle(s) for s in fleet.servers)), None, ())


def _size(server: Server) -> tuple[int, int, str]:
    return len(server.cards), max((c.memory_mib for c in server.cards), default=0), server.name


def never_fits(fleet: Fleet, demand: Demand, granularity: Granularity) -> NeverFits | None:
    """Why ``demand`` can fit no server of ``fleet`` ever, or ``None`` when some server could
    (or the fleet is empty: servers may yet join)."""
    if not fleet.servers:
        return None
    decision = choose(_idle_view(fleet), demand, Unclaimed(), granularity=granularity)
    if not isinstance(decision, Refusal):
        return None
    largest = max(fleet.servers, key=_size)
    return NeverFits(nofit=decision.nofit, servers=len(fleet.servers), largest=largest)


def capable_servers(fleet: Fleet, demand: Demand, granularity: Granularity) -> int:
    """How many servers of ``fleet`` could take ``demand`` alone, were they idle and healthy
    (a gang of more members than that can never be admitted whole)."""
    view = _idle_view(fleet)
    return sum(1 for f in view.order if fit(f, demand, Unclaimed(), granularity) is not None)
