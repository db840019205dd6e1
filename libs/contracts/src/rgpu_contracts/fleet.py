"""The fleet is what discovery publishes and everyone else decides on.

A ``Fleet`` is a frozen snapshot: servers with their cards, busy sets and probe results, plus a
``revision`` that changes exactly when something allocation-relevant changes, so long-poll
clients can wait for "newer than R".

A server is one lupine listener. Usually that is a whole Node (the server is named after it);
a Node that runs one lupine per GPU declares its instances, and each is a server of its own,
named ``<node>@<port>``, with ``node`` naming the Node it runs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from . import _validate as v
from .ids import CardId, GpuUuid, NodeName, ServerName

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
    cordoned: bool


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
    node: str | None
    cordoned: bool
    cudaVersion: str | None


class FleetDict(TypedDict):
    revision: int
    observedAt: float
    servers: list[ServerDict]


@dataclass(frozen=True, slots=True, kw_only=True)
class Card:
    """One GPU of a server, as registered by HAMi's device plugin.

    ``cordoned``: the GPU is listed in its Node's ``hami.io/device-cordon`` annotation, so no
    new pod is booked on it (holders stay).
    """

    id: CardId
    server: ServerName
    uuid: GpuUuid
    index: int
    memory_mib: int
    cores: int
    model: str
    numa: int
    healthy: bool
    cordoned: bool = False

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
            "cordoned": self.cordoned,
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
            cordoned=v.boolean(m, "cordoned", path, False),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Server:
    """A lupine server node and everything scheduling needs to know about it.

    ``reachable`` stays true until two probes in a row failed (and before the first probe);
    ``usage_reported`` is false when lupine has no ``/metrics`` (busy set unknown, not empty);
    ``error`` explains why a listed server has no cards or no endpoint.
    ``node`` names the Node a lupine instance runs on (``None``: the server is its Node);
    ``cordoned`` is the Node's ``spec.unschedulable`` (no new bookings, holders stay);
    ``cuda_version`` is what lupine answered in ``x-lupine-cuda-version`` (``None`` until known).
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
    node: NodeName | None = None
    cordoned: bool = False
    cuda_version: str | None = None

    @property
    def node_name(self) -> NodeName:
        """The Node this server runs on."""
        return self.node if self.node is not None else NodeName(self.name)

    @property
    def cuda_major(self) -> int | None:
        """The major number of ``cuda_version`` (``12`` for ``12.4``); ``None`` when unknown
        or unreadable."""
        head = (self.cuda_version or "").split(".", 1)[0].strip()
        return int(head) if head.isascii() and head.isdigit() and len(head) < 6 else None

    @property
    def cordoned_cards(self) -> frozenset[GpuUuid]:
        """GPUs of this server listed in its Node's device cordon."""
        return frozenset(card.uuid for card in self.cards if card.cordoned)

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
            "node": self.node,
            "cordoned": self.cordoned,
            "cudaVersion": self.cuda_version,
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
            node=_node(m, path),
            cordoned=v.boolean(m, "cordoned", path, False),
            cuda_version=v.opt_limited(m, "cudaVersion", path, _MAX_VERSION_CHARS),
        )


_MAX_VERSION_CHARS = 64
"""A CUDA version is a few characters ("12.4"); anything longer is not one."""


def _node(m: Mapping[str, object], path: str) -> NodeName | None:
    value = v.opt_string(m, "node", path)
    return None if value is None else NodeName(value)


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
