"""One card has one state on a dashboard and in ``rgpu status``, even when several facts apply.

A card can be on a server that is down, be unhealthy, be claimed and be busy all at once. The
exporter and the CLI show exactly one state per card, the first that applies in this order
(highest first):

1. ``unavailable`` - the server is not ``Ready`` or its lupine port stopped answering: nothing
   else about the card can be acted on until the server is back.
2. ``unhealthy`` - the device plugin reports the card unhealthy: it cannot be scheduled
   whoever holds it.
3. ``bound`` > ``committed`` > ``booked`` - a claim holds the card; the most advanced claim
   state wins because it is the one closest to a running workload.
4. ``busy`` - lupine reports a client on the card but no claim explains it: someone outside
   rgpu uses it, which is worth seeing apart from a plain claim.
5. ``free``.

``allocated`` (HAMi's flag) is independent of that order: it is 1 whenever the card is claimed
or busy, even on an unavailable server, because the memory is still promised to someone.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rgpu_contracts import Card, CardId, Claim, ClaimSet, ClaimState, Server, ServerName

from ._precedence import state_rank

__all__ = [
    "CardState",
    "CardView",
    "claims_by_server",
    "holding_claims",
    "view_cards",
]


class CardState(enum.StrEnum):
    """The one state a card is shown in; declared highest precedence first."""

    UNAVAILABLE = "unavailable"
    UNHEALTHY = "unhealthy"
    BOUND = "bound"
    COMMITTED = "committed"
    BOOKED = "booked"
    BUSY = "busy"
    FREE = "free"


_CLAIM_STATES = {
    ClaimState.BOUND: CardState.BOUND,
    ClaimState.COMMITTED: CardState.COMMITTED,
    ClaimState.BOOKED: CardState.BOOKED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CardView:
    """A card as the exporter shows it: its state, the claim holding it and its lupine use."""

    card: Card
    state: CardState
    holder: Claim | None
    busy: bool

    @property
    def allocated(self) -> bool:
        """HAMi's ``allocated`` flag: the card is promised to (or used by) somebody."""
        return self.holder is not None or self.busy


def claims_by_server(claims: ClaimSet | None) -> dict[ServerName, tuple[Claim, ...]]:
    """Group claims by the server they name, each group in a stable order."""
    groups: dict[ServerName, list[Claim]] = {}
    for claim in claims.claims if claims is not None else ():
        groups.setdefault(claim.server, []).append(claim)
    return {server: tuple(sorted(group, key=_claim_order)) for server, group in groups.items()}


def holding_claims(claims: Iterable[Claim]) -> dict[CardId, Claim]:
    """The claim shown as holding each card.

    Two claims on one card mean the allocator lost track of something; the exporter still shows
    the card once, with the most advanced claim (then the oldest booking, then the pod uid) so
    the answer does not flicker between scrapes.
    """
    holders: dict[CardId, Claim] = {}
    for claim in sorted(claims, key=_claim_order):
        for card in claim.cards:
            holders.setdefault(card, claim)
    return holders


def view_cards(server: Server, holders: Mapping[CardId, Claim]) -> tuple[CardView, ...]:
    """Every card of ``server`` with its shown state, in the server's card order."""
    available = server.ready and server.reachable
    return tuple(_view(card, server, available, holders.get(card.id)) for card in server.cards)


def _view(card: Card, server: Server, available: bool, holder: Claim | None) -> CardView:
    busy = card.uuid in server.busy
    return CardView(
        card=card, state=_state(card, available, holder, busy), holder=holder, busy=busy
    )


def _state(card: Card, available: bool, holder: Claim | None, busy: bool) -> CardState:
    if not available:
        return CardState.UNAVAILABLE
    if not card.healthy:
        return CardState.UNHEALTHY
    if holder is not None:
        return _CLAIM_STATES[holder.state]
    return CardState.BUSY if busy else CardState.FREE


def _claim_order(claim: Claim) -> tuple[int, float, str]:
    return (state_rank(claim.state), claim.booked_at, claim.pod.uid)
