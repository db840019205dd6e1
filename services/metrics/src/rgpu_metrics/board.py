"""A scrape must render from memory, fast, whatever the sources do.

The ``Board`` keeps the last fleet and the last claim set the followers received (the last
good one stays when a source is away) and the exposition built from them. Building is lazy
and incremental: a source change only marks the block stale; the next scrape re-renders the
servers whose ``Server`` value or claims changed, reuses every other server's lines, and
joins them. Claims change with every scheduled pod, far more often than Prometheus scrapes,
so rendering per scrape rather than per change does the least work.

A server missing from the newest fleet has no lines in the next block: its series vanish.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rgpu_contracts import Claim, ClaimSet, Fleet, Server, ServerName
from rgpu_placement import claims_by_server

from .rendering import CardBlock, ServerLines, assemble, render_server

__all__ = ["Board"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rendered:
    server: Server
    claims: tuple[Claim, ...]
    lines: ServerLines

    def still_valid(self, server: Server, claims: tuple[Claim, ...]) -> bool:
        return (self.server is server or self.server == server) and self.claims == claims


class Board:
    """The last fleet and claims, and their card families, rebuilt on demand."""

    __slots__ = ("_block", "_by_server", "_claims", "_fleet", "_on_claims", "_rendered")

    def __init__(self, *, on_claims: Callable[[ClaimSet], None] | None = None) -> None:
        """``on_claims`` hears of every new claim set (usage counting)."""
        self._on_claims = on_claims
        self._fleet: Fleet | None = None
        self._claims: ClaimSet | None = None
        self._by_server: dict[ServerName, tuple[Claim, ...]] = {}
        self._rendered: dict[ServerName, _Rendered] = {}
        self._block: CardBlock | None = None

    @property
    def fleet(self) -> Fleet | None:
        """The last fleet discovery published, if any arrived yet."""
        return self._fleet

    @property
    def claims(self) -> ClaimSet | None:
        """The last claim set the allocator published, if any arrived yet."""
        return self._claims

    def set_fleet(self, fleet: Fleet) -> None:
        """Replace the fleet; the next ``block()`` reflects it."""
        self._fleet = fleet
        self._block = None

    def set_claims(self, claims: ClaimSet) -> None:
        """Replace the claim set; the next ``block()`` reflects it."""
        self._claims = claims
        self._by_server = claims_by_server(claims)
        self._block = None
        if self._on_claims is not None:
            self._on_claims(claims)

    def block(self) -> CardBlock:
        """The card families for the current fleet and claims (cached until either changes)."""
        if self._block is None:
            self._block = self._rebuild()
        return self._block

    def _rebuild(self) -> CardBlock:
        servers = _unique_servers(self._fleet)
        self._rendered = {server.name: self._render(server) for server in servers}
        return assemble([rendered.lines for rendered in self._rendered.values()])

    def _render(self, server: Server) -> _Rendered:
        claims = self._by_server.get(server.name, ())
        cached = self._rendered.get(server.name)
        if cached is not None and cached.still_valid(server, claims):
            return cached
        return _Rendered(server=server, claims=claims, lines=render_server(server, claims))


def _unique_servers(fleet: Fleet | None) -> list[Server]:
    """Servers by name, the first of any duplicate name only, so each card is exported once."""
    unique: dict[ServerName, Server] = {}
    for server in fleet.servers if fleet is not None else ():
        unique.setdefault(server.name, server)
    return [unique[name] for name in sorted(unique)]
