"""Why this module exists: operators ask "what is held by whom" — ``rgpu status`` answers from
discovery's fleet and the allocator's claims, the same two sources the metrics service uses."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from rich.table import Table

from rgpu_contracts import Claim, ClaimSet, Fleet, Server

__all__ = ["Snapshot", "card_state", "fetch_snapshot", "status_table"]


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


def card_state(server: Server, uuid: str, healthy: bool, claim: Claim | None) -> str:
    """One word per card, with the precedence the metrics service uses."""
    if not (server.ready and server.reachable):
        return "unavailable"
    if not healthy:
        return "unhealthy"
    if claim is not None:
        return claim.state.value
    return "busy" if uuid in server.busy else "free"


_STYLE = {
    "free": "green",
    "booked": "yellow",
    "committed": "yellow",
    "bound": "cyan",
    "busy": "magenta",
}


def status_table(snapshot: Snapshot) -> Table:
    """Servers, cards, states and holders as a table."""
    holders = {card: claim for claim in snapshot.claims.claims for card in claim.cards}
    held = len(snapshot.claims.claims)
    table = Table(title=f"rgpu fleet (revision {snapshot.fleet.revision}, {held} claims)")
    for column in ("server", "endpoint", "card", "model", "MiB", "state", "holder"):
        table.add_column(column)
    for server in snapshot.fleet.servers:
        if not server.cards:
            table.add_row(
                server.name,
                server.endpoint or "-",
                "-",
                "-",
                "-",
                "[red]no cards[/]",
                server.error or "",
            )
        for card in server.cards:
            claim = holders.get(card.id)
            state = card_state(server, card.uuid, card.healthy, claim)
            style = _STYLE.get(state, "red")
            table.add_row(
                server.name,
                server.endpoint or "-",
                f"{card.index}:{card.uuid}",
                card.model,
                str(card.memory_mib),
                f"[{style}]{state}[/]",
                claim.pod.key if claim else "",
            )
    return table
