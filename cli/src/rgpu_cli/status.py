"""Operators ask "what is held by whom" — ``rgpu status`` answers from
discovery's fleet and the allocator's claims, the same two sources the metrics service uses."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from rich.table import Table

from rgpu_contracts import ClaimSet, Fleet
from rgpu_placement import holding_claims, view_cards

__all__ = ["Snapshot", "fetch_snapshot", "status_table"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The fleet and the claims, read one after the other."""

    fleet: Fleet
    claims: ClaimSet


async def fetch_snapshot(
    discovery_url: str, allocator_url: str, *, timeout: float = 5.0
) -> Snapshot:
    """Read both sources; raises ``httpx.HTTPError`` or ``ContractError`` with the cause."""
    async with httpx.AsyncClient(timeout=timeout) as client:
        fleet = await client.get(f"{discovery_url}/v1/fleet")
        fleet.raise_for_status()
        claims = await client.get(f"{allocator_url}/v1/claims")
        claims.raise_for_status()
    return Snapshot(fleet=Fleet.from_dict(fleet.json()), claims=ClaimSet.from_dict(claims.json()))


_STYLE = {
    "free": "green",
    "booked": "yellow",
    "committed": "yellow",
    "bound": "cyan",
    "busy": "magenta",
}


def status_table(snapshot: Snapshot) -> Table:
    """Servers, cards, states and holders as a table."""
    # The metrics service's own card view, so `rgpu status` and the dashboards never disagree.
    holders = holding_claims(snapshot.claims.claims)
    held = len(snapshot.claims.claims)
    table = Table(title=f"rgpu fleet (revision {snapshot.fleet.revision}, {held} claims)")
    for column in ("server", "endpoint", "CUDA", "card", "model", "MiB", "state", "holder"):
        table.add_column(column)
    for server in snapshot.fleet.servers:
        endpoint, cuda = server.endpoint or "-", server.cuda_version or "-"
        name = f"{server.name} [yellow](cordoned)[/]" if server.cordoned else server.name
        if not server.cards:
            table.add_row(
                name, endpoint, cuda, "-", "-", "-", "[red]no cards[/]", server.error or ""
            )
        for view in view_cards(server, holders):
            card, state = view.card, view.state.value
            # A cordon stops new bookings only: the card keeps its state (and its holder).
            cordon = " [yellow]cordoned[/]" if card.cordoned or server.cordoned else ""
            table.add_row(
                name,
                endpoint,
                cuda,
                f"{card.index}:{card.uuid}",
                card.model,
                str(card.memory_mib),
                f"[{_STYLE.get(state, 'red')}]{state}[/]{cordon}",
                view.holder.pod.key if view.holder else "",
            )
    return table
