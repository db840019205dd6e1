"""Operators ask "what is held by whom" — ``rgpu status`` answers from
discovery's fleet and the allocator's claims, the same two sources the metrics service uses,
with the metrics service's own card states, so ``rgpu status`` and the dashboards never
disagree.

Three shapes, as ``kubectl get`` has them: a summary and one line per server (the default,
readable at 80 columns and piped), one line per card (``-o wide``), and JSON (``-o json``) for
scripts. Filters pick cards by server, state or holder before any of them is drawn.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx

from rgpu_contracts import ClaimSet, ContractError, Fleet
from rgpu_placement import CardState, holding_claims, view_cards

from .columns import columns

__all__ = [
    "CardRow",
    "Filters",
    "Snapshot",
    "SourceError",
    "card_rows",
    "fetch_snapshot",
    "render_json",
    "render_servers",
    "render_wide",
    "summary",
]

HELD = frozenset({CardState.BOUND.value, CardState.COMMITTED.value, CardState.BOOKED.value})
STATES = (*(s.value for s in CardState), "held", "no-cards")
"""What ``--state`` accepts: a card state, ``held`` (booked, committed or bound), or
``no-cards`` (a server whose register annotation lists no remote card)."""


class SourceError(Exception):
    """Discovery or the allocator could not be read; the message names the URL and the fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The fleet and the claims, read one after the other."""

    fleet: Fleet
    claims: ClaimSet


async def _read(client: httpx.AsyncClient, url: str, source: str) -> Any:
    try:
        response = await client.get(url)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        cause = str(exc) or type(exc).__name__
        setting = f"RGPU_{source.upper()}_URL"
        raise SourceError(
            f"cannot read {url} ({cause}): is the stack running (`rgpu up --sim`)? If "
            f"{source} answers elsewhere, set {setting} or --{source}-url to its address"
        ) from exc


async def fetch_snapshot(
    discovery_url: str, allocator_url: str, *, timeout: float = 5.0
) -> Snapshot:
    """Read both sources; raises ``SourceError`` naming the one that failed."""
    async with httpx.AsyncClient(timeout=timeout) as client:
        fleet = await _read(client, f"{discovery_url}/v1/fleet", "discovery")
        claims = await _read(client, f"{allocator_url}/v1/claims", "allocator")
    try:
        return Snapshot(fleet=Fleet.from_dict(fleet), claims=ClaimSet.from_dict(claims))
    except ContractError as exc:
        raise SourceError(f"unreadable answer from discovery or the allocator: {exc}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class CardRow:
    """One card (or a server without cards) as ``status`` shows it."""

    server: str
    endpoint: str
    index: int | None
    uuid: str
    model: str
    memory_mib: int | None
    state: str
    holder: str
    error: str = ""
    cuda: str = ""
    """The CUDA version the server's lupine reports (empty until known)."""
    cordoned: bool = False
    """No new bookings (the card, or its whole server, is cordoned); the state is kept."""
    server_cordoned: bool = False

    @property
    def shown_state(self) -> str:
        return f"{self.state} cordoned" if self.cordoned else self.state

    @property
    def shown_server(self) -> str:
        return f"{self.server} (cordoned)" if self.server_cordoned else self.server

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "endpoint": self.endpoint,
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "memoryMiB": self.memory_mib,
            "state": self.state,
            "holder": self.holder or None,
            "error": self.error or None,
            "cuda": self.cuda or None,
            "cordoned": self.cordoned,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Filters:
    """Which cards to show; empty means all."""

    servers: frozenset[str] = frozenset()
    states: frozenset[str] = frozenset()
    holder: str = ""

    def keep(self, row: CardRow) -> bool:
        if self.servers and row.server not in self.servers:
            return False
        if self.holder and row.holder != self.holder:
            return False
        held = "held" in self.states and row.state in HELD
        return not self.states or held or row.state in self.states


def card_rows(snapshot: Snapshot) -> list[CardRow]:
    """Every card of the fleet with its state and holder, servers without cards as one row."""
    holders = holding_claims(snapshot.claims.claims)
    rows = []
    for server in snapshot.fleet.servers:
        row = partial(
            CardRow,
            server=server.name,
            endpoint=server.endpoint or "",
            cuda=server.cuda_version or "",
            server_cordoned=server.cordoned,
        )
        if not server.cards:
            rows.append(
                row(
                    index=None,
                    uuid="",
                    model="",
                    memory_mib=None,
                    state="no-cards",
                    holder="",
                    error=server.error or "",
                    cordoned=server.cordoned,
                )
            )
        for view in view_cards(server, holders):
            card = view.card
            rows.append(
                row(
                    index=card.index,
                    uuid=card.uuid,
                    model=card.model,
                    memory_mib=card.memory_mib,
                    state=view.state.value,
                    holder=view.holder.pod.key if view.holder else "",
                    # A cordon stops new bookings only: the card keeps its state and holder.
                    cordoned=card.cordoned or server.cordoned,
                )
            )
    return rows


def summary(snapshot: Snapshot, rows: Sequence[CardRow]) -> str:
    """One line: servers, cards by state, claims and the fleet revision."""
    cards = [row for row in rows if row.index is not None]
    states = Counter(row.state for row in cards)
    held = sum(states[s] for s in HELD)
    parts = [f"{states.get('free', 0)} free", f"{held} held"]
    parts += [f"{n} {state}" for state, n in states.most_common() if state not in HELD | {"free"}]
    cordoned = sum(row.cordoned for row in cards)
    parts += [f"{cordoned} cordoned"] if cordoned else []
    servers = len({row.server for row in rows})
    return (
        f"{servers} servers, {len(cards)} cards: {', '.join(parts)}; "
        f"{len(snapshot.claims.claims)} claims (fleet revision {snapshot.fleet.revision})"
    )


def _server_state(rows: Iterable[CardRow]) -> str:
    counts = Counter(row.shown_state for row in rows)
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def render_servers(rows: Sequence[CardRow]) -> str:
    """One line per server: its endpoint, card count, states and holders."""
    by_server: dict[str, list[CardRow]] = {}
    for row in rows:
        by_server.setdefault(row.server, []).append(row)
    table = []
    for cards in by_server.values():
        holders = sorted({row.holder for row in cards if row.holder})
        error = next((row.error for row in cards if row.error), "")
        shown = [row for row in cards if row.index is not None]
        states = _server_state(cards) + (f" ({error})" if error else "")
        first = cards[0]
        table.append(
            (
                first.shown_server,
                first.endpoint,
                first.cuda,
                str(len(shown)),
                states,
                ", ".join(holders),
            )
        )
    return columns(("server", "endpoint", "cuda", "cards", "states", "holders"), table)


def render_wide(rows: Sequence[CardRow]) -> str:
    """One line per card, every field whole."""
    table = [
        (
            row.shown_server,
            row.endpoint,
            row.cuda,
            "" if row.index is None else str(row.index),
            row.uuid,
            row.model,
            "" if row.memory_mib is None else str(row.memory_mib),
            row.shown_state,
            row.holder or row.error,
        )
        for row in rows
    ]
    headers = ("server", "endpoint", "cuda", "card", "uuid", "model", "mib", "state", "holder")
    return columns(headers, table)


def render_json(snapshot: Snapshot, rows: Sequence[CardRow]) -> dict[str, Any]:
    """What scripts read: the revision, the claim count and the cards shown."""
    return {
        "fleetRevision": snapshot.fleet.revision,
        "claims": len(snapshot.claims.claims),
        "cards": [row.to_dict() for row in rows],
    }
