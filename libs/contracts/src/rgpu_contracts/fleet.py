"""The fleet is what discovery publishes and everyone else decides on.

A ``Fleet`` is a frozen snapshot: servers with their cards, busy sets and probe results, plus a
``revision`` that changes exactly when something allocation-relevant changes, so long-poll
clients can wait for "newer than R".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from . import _validate as v
from .ids import CardId, GpuUuid, ServerName

__all__ = ["Card", "CardDict", "Fleet", "FleetDict", "Server", "ServerDict"]


class CardDict(TypedDict):
    id: str
    server: str
    uuid: str
    index: int
    memoryMiB: int
    cores: int
    model: str
    numa: int
    healthy: bool


class ServerDict(TypedDict):
    name: str
    endpoint: str | None
    port: int
    ready: bool
    reachable: bool
    usageReported: bool
    busy: list[str]
    topology: dict[str, str]
    cards: list[CardDict]
    error: str | None


class FleetDict(TypedDict):
    revision: int
    observedAt: float
    servers: list[ServerDict]


@dataclass(frozen=True, slots=True, kw_only=True)
class Card:
    """One GPU of a server, as registered by HAMi's device plugin."""

    id: CardId
    server: ServerName
    uuid: GpuUuid
    index: int
    memory_mib: int
    cores: int
    model: str
    numa: int
    healthy: bool

    def to_dict(self) -> CardDict:
        return {
            "id": self.id,
            "server": self.server,
            "uuid": self.uuid,
            "index": self.index,
            "memoryMiB": self.memory_mib,
            "cores": self.cores,
            "model": self.model,
            "numa": self.numa,
            "healthy": self.healthy,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> Card:
        m = v.as_mapping(raw, path)
        return cls(
            id=CardId(v.string(m, "id", path)),
            server=ServerName(v.string(m, "server", path)),
            uuid=GpuUuid(v.string(m, "uuid", path)),
            index=v.integer(m, "index", path, minimum=0),
            memory_mib=v.integer(m, "memoryMiB", path, minimum=0),
            cores=v.integer(m, "cores", path, minimum=0),
            model=v.string(m, "model", path, ""),
            numa=v.integer(m, "numa", path, 0),
            healthy=v.boolean(m, "healthy", path),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Server:
    """A lupine server node and everything scheduling needs to know about it.

    ``reachable`` stays true until two probes in a row failed (and before the first probe);
    ``usage_reported`` is false when lupine has no ``/metrics`` (busy set unknown, not empty);
    ``error`` explains why a listed server has no cards or no endpoint.
    """

    name: ServerName
    endpoint: str | None
    port: int
    ready: bool
    reachable: bool
    usage_reported: bool
    busy: frozenset[GpuUuid]
    topology: tuple[tuple[str, str], ...]
    cards: tuple[Card, ...]
    error: str | None = None

    @property
    def healthy_cards(self) -> tuple[Card, ...]:
        return tuple(card for card in self.cards if card.healthy)

    def label(self, key: str) -> str | None:
        """The value of topology label ``key`` on this server, if any."""
        return dict(self.topology).get(key)

    def to_dict(self) -> ServerDict:
        return {
            "name": self.name,
            "endpoint": self.endpoint,
            "port": self.port,
            "ready": self.ready,
            "reachable": self.reachable,
            "usageReported": self.usage_reported,
            "busy": sorted(self.busy),
            "topology": dict(self.topology),
            "cards": [card.to_dict() for card in self.cards],
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> Server:
        m = v.as_mapping(raw, path)
        return cls(
            name=ServerName(v.string(m, "name", path)),
            endpoint=v.opt_string(m, "endpoint", path),
            port=v.integer(m, "port", path, minimum=1, maximum=65535),
            ready=v.boolean(m, "ready", path),
            reachable=v.boolean(m, "reachable", path),
            usage_reported=v.boolean(m, "usageReported", path, False),
            busy=frozenset(GpuUuid(u) for u in v.strings(m, "busy", path, ())),
            topology=v.string_map(m, "topology", path, {}),
            cards=v.items(m, "cards", path, Card.from_dict, ()),
            error=v.opt_string(m, "error", path),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """All servers at one ``revision``; ``observed_at`` is the Unix time it was built."""

    revision: int
    observed_at: float
    servers: tuple[Server, ...]

    def server(self, name: str) -> Server | None:
        """Find a server by node name (linear; callers index when they look up often)."""
        return next((s for s in self.servers if s.name == name), None)

    def to_dict(self) -> FleetDict:
        return {
            "revision": self.revision,
            "observedAt": self.observed_at,
            "servers": [server.to_dict() for server in self.servers],
        }

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> Fleet:
        m = v.as_mapping(raw, path)
        return cls(
            revision=v.integer(m, "revision", path, minimum=0),
            observed_at=v.number(m, "observedAt", path),
            servers=v.items(m, "servers", path, Server.from_dict),
        )
