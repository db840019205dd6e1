"""Every test, benchmark and demo needs a believable cluster — GPU
servers labelled and annotated exactly as HAMi writes them, client nodes spread over the same
racks and zones, fake lupine servers really listening where the Nodes say — and it must be the
same cluster every time for a given seed, so a failure can be replayed.

``plan_fleet`` is pure (no sockets, no clock); ``seed_fleet`` starts the lupine servers first,
learns their real ports, then writes the Nodes.
"""

from __future__ import annotations

import ipaddress
import json
import random
import re
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from rgpu_contracts.hami import ANNOTATION_REGISTER, DEFAULT_LUPINE_PORT, LABEL_SERVER
from rgpu_contracts.ids import GpuUuid
from rgpu_contracts.instances import ANNOTATION_INSTANCES, LupineInstance, encode_instances
from rgpu_kubesim._lupine_errors import AddressUnavailable, SimOptionError
from rgpu_kubesim.fleet._nodes import Placement, client_node, server_node
from rgpu_kubesim.fleet._workload import (
    ANNOTATION_RUN_SECONDS,
    ContainerPlan,
    PodPlan,
    WorkloadSpec,
    plan_workload,
)
from rgpu_kubesim.lupine import FakeLupine, LupineFleet, LupineSpec, Mode, open_lupine_fleet

__all__ = [
    "ANNOTATION_RUN_SECONDS",
    "DEFAULT_MODELS",
    "CardPlan",
    "ClientPlan",
    "ContainerPlan",
    "FleetPlan",
    "FleetSpec",
    "GpuModel",
    "NodeStore",
    "Placement",
    "PodPlan",
    "SeededFleet",
    "ServerPlan",
    "WorkloadSpec",
    "plan_fleet",
    "plan_workload",
    "seed_fleet",
]

Manifest = dict[str, Any]

_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# 127.0.0.0/8 minus 127.0.0.x (where everyone's port-0 servers live) and the /8's edges.
_FIRST_HOST: Final = int(ipaddress.IPv4Address("127.1.0.0"))
_LAST_HOST: Final = int(ipaddress.IPv4Address("127.254.255.254"))
# The seeded start lies in the lower half, so the start does not depend on the fleet's size.
_START_SPAN: Final = (_LAST_HOST - _FIRST_HOST) // 2
_MAX_NODES: Final = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuModel:
    """A GPU model as NVML names it (lupine metrics) and its memory in MiB (HAMi ``devmem``)."""

    nvml_name: str
    memory_mib: int

    @property
    def register_type(self) -> str:
        """HAMi's ``type``: the NVML name with spaces turned into dashes."""
        return self.nvml_name.replace(" ", "-")


DEFAULT_MODELS: Final = (
    GpuModel(nvml_name="NVIDIA A100-SXM4-80GB", memory_mib=81920),
    GpuModel(nvml_name="NVIDIA A100-SXM4-40GB", memory_mib=40960),
    GpuModel(nvml_name="NVIDIA H100 80GB HBM3", memory_mib=81559),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSpec:
    """How big a fleet to plan; the same spec always plans the same fleet.

    Shares are probabilities drawn per server (ports, modes) or per card (health).
    """

    servers: int = 4
    cards: int = 8
    clients: int = 16
    seed: int = 0
    zones: int = 2
    racks_per_zone: int = 2
    region: str = "sim-1"
    default_port_share: float = 0.25
    """Servers whose label is empty (port 14833) when that port is free on their address."""
    h2only_share: float = 0.0
    """Servers running an old lupine build that speaks only HTTP/2."""
    unhealthy_share: float = 0.0
    """Cards registered with ``health: false``."""
    per_gpu: bool = False
    """Every server Node runs one lupine per GPU (``rgpu.io/lupine-instances``), each on a
    port of its own: a server of one card each."""
    models: tuple[GpuModel, ...] = DEFAULT_MODELS
    server_prefix: str = "gpu-"
    client_prefix: str = "node-"

    def __post_init__(self) -> None:
        _at_least("servers", self.servers, 0)
        _at_least("cards", self.cards, 1)
        _at_least("clients", self.clients, 0)
        _at_least("zones", self.zones, 1)
        _at_least("racks_per_zone", self.racks_per_zone, 1)
        for name in ("default_port_share", "h2only_share", "unhealthy_share"):
            _share(name, getattr(self, name))
        _dns_label("region", f"{self.region}a")
        _dns_label("server_prefix", f"{self.server_prefix}0")
        _dns_label("client_prefix", f"{self.client_prefix}0")
        if not self.models:
            raise SimOptionError("models", "give at least one GpuModel")
        if self.servers + self.clients > _MAX_NODES:
            raise SimOptionError("servers", f"servers + clients must be <= {_MAX_NODES}")


def _at_least(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SimOptionError(name, f"must be a whole number >= {minimum}, got {value!r}")


def _share(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise SimOptionError(name, f"must be between 0 and 1, got {value!r}")


def _dns_label(name: str, sample: str) -> None:
    if len(sample) > 50 or not _DNS_LABEL.match(sample):
        raise SimOptionError(name, f"{sample!r} would not make a DNS-1123 name (a-z, 0-9, '-')")


@dataclass(frozen=True, slots=True, kw_only=True)
class CardPlan:
    """One GPU of a planned server."""

    uuid: str
    index: int
    memory_mib: int
    numa: int
    healthy: bool

    def register_entry(self, model: GpuModel) -> dict[str, object]:
        """The card as HAMi's device plugin registers it (index 0 and numa 0 omitted)."""
        entry: dict[str, object] = {"id": self.uuid}
        if self.index:
            entry["index"] = self.index
        entry |= {"count": 10, "devmem": self.memory_mib, "devcore": 100}
        entry["type"] = model.register_type
        if self.numa:
            entry["numa"] = self.numa
        return entry | {"mode": "remote", "health": self.healthy}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerPlan:
    """A GPU server: its Node (minus the port) and the fake lupine standing behind it."""

    name: str
    address: str
    placement: Placement
    model: GpuModel
    cards: tuple[CardPlan, ...]
    default_port: bool
    mode: Mode
    per_gpu: bool = False
    """One lupine per card, each its own server ``<name>@<port>``."""

    def register_annotation(self) -> str:
        """``hami.io/node-nvidia-register`` as compact JSON, the way Go's encoder writes it."""
        entries = [card.register_entry(self.model) for card in self.cards]
        return json.dumps(entries, separators=(",", ":"))

    def lupine_spec(self, port: int, cards: tuple[CardPlan, ...] | None = None) -> LupineSpec:
        """What to start so the Node's endpoint answers (``cards``: one instance's)."""
        return LupineSpec(
            name=self.name,
            instance=cards is not None,
            host=self.address,
            port=port,
            mode=self.mode,
            gpus=tuple(card.uuid for card in (self.cards if cards is None else cards)),
            device_type=self.model.nvml_name,
            gpu_memory_bytes=self.model.memory_mib << 20,
        )

    def node(self, *, port: int, now: datetime, instances: tuple[int, ...] = ()) -> Manifest:
        """The Node manifest; the label is empty only when the planned default port was won.
        ``instances``: the ports of its lupine instances, one per card in card order."""
        label = "" if self.default_port and port == DEFAULT_LUPINE_PORT else str(port)
        annotations = {ANNOTATION_REGISTER: self.register_annotation()}
        if instances:
            laid = [
                LupineInstance(port=p, gpus=(GpuUuid(card.uuid),))
                for p, card in zip(instances, self.cards, strict=True)
            ]
            annotations[ANNOTATION_INSTANCES] = encode_instances(laid)
        return server_node(
            name=self.name,
            address=self.address,
            placement=self.placement,
            labels={LABEL_SERVER: label},
            annotations=annotations,
            now=now,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientPlan:
    """A GPU-less node where client pods run."""

    name: str
    address: str
    placement: Placement

    def node(self, *, now: datetime) -> Manifest:
        """The Node manifest."""
        return client_node(name=self.name, address=self.address, placement=self.placement, now=now)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetPlan:
    """A planned cluster; pure data, ready for ``seed_fleet``."""

    spec: FleetSpec
    servers: tuple[ServerPlan, ...]
    clients: tuple[ClientPlan, ...]

    def server(self, name: str) -> ServerPlan:
        """The planned server called ``name``; raises ``SimOptionError``."""
        for server in self.servers:
            if server.name == name:
                return server
        raise SimOptionError("name", f"no planned server {name!r}")


def plan_fleet(spec: FleetSpec) -> FleetPlan:
    """Plan servers and clients deterministically from ``spec`` (no I/O)."""
    racks = _racks(spec)
    hosts = _addresses(spec)
    servers = tuple(
        _plan_server(spec, i, next(hosts), racks[i % len(racks)]) for i in range(spec.servers)
    )
    offset = random.Random(f"rgpu-fleet:{spec.seed}:clients").randrange(len(racks))
    clients = tuple(
        ClientPlan(
            name=_name(spec.client_prefix, i, spec.clients),
            address=next(hosts),
            placement=racks[(i + offset) % len(racks)],
        )
        for i in range(spec.clients)
    )
    return FleetPlan(spec=spec, servers=servers, clients=clients)


def _name(prefix: str, i: int, total: int) -> str:
    return f"{prefix}{i + 1:0{max(2, len(str(total)))}d}"


def _racks(spec: FleetSpec) -> tuple[Placement, ...]:
    zones = [f"{spec.region}{chr(ord('a') + z % 26)}{z // 26 or ''}" for z in range(spec.zones)]
    racks = [
        Placement(region=spec.region, zone=zone, rack=f"{zone}-r{r + 1}")
        for zone in zones
        for r in range(spec.racks_per_zone)
    ]
    random.Random(f"rgpu-fleet:{spec.seed}:racks").shuffle(racks)
    return tuple(racks)


def _addresses(spec: FleetSpec) -> Iterator[str]:
    """Consecutive loopback addresses from a seeded start, skipping .0 and .255 endings."""
    host = _FIRST_HOST + random.Random(f"rgpu-fleet:{spec.seed}:addresses").randrange(_START_SPAN)
    while True:
        if host & 0xFF not in (0, 255):
            yield str(ipaddress.IPv4Address(host))
        host += 1


def _plan_server(spec: FleetSpec, i: int, address: str, placement: Placement) -> ServerPlan:
    # One stream per server, so growing the fleet keeps the existing servers as they were.
    rng = random.Random(f"rgpu-fleet:{spec.seed}:server:{i}")
    model = rng.choice(spec.models)
    default_port = rng.random() < spec.default_port_share
    mode: Mode = "h2only" if rng.random() < spec.h2only_share else "sniff"
    cards = tuple(
        CardPlan(
            uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
            index=c,
            memory_mib=model.memory_mib,
            numa=0 if c < (spec.cards + 1) // 2 else 1,
            healthy=rng.random() >= spec.unhealthy_share,
        )
        for c in range(spec.cards)
    )
    return ServerPlan(
        name=_name(spec.server_prefix, i, spec.servers),
        address=address,
        placement=placement,
        model=model,
        cards=cards,
        default_port=default_port,
        mode=mode,
        per_gpu=spec.per_gpu,
    )


class NodeStore(Protocol):
    """What ``seed_fleet`` needs from the simulated apiserver's ``Store``."""

    def create(self, resource: str, obj: Manifest, /) -> Mapping[str, Any]:
        """Create an object of ``resource`` (``"nodes"``) and return it as stored."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SeededFleet:
    """A fleet that runs: its fake lupine servers and the Nodes written for them."""

    plan: FleetPlan
    lupine: LupineFleet
    nodes: tuple[Manifest, ...]
    """The Nodes as the store returned them (servers first, in plan order)."""

    def endpoints(self) -> Mapping[str, str]:
        """Server name → ``host:port`` its Node advertises."""
        return {server.name: server.endpoint for server in self.lupine}


@asynccontextmanager
async def seed_fleet(
    store: NodeStore, plan: FleetPlan, *, now: datetime | None = None
) -> AsyncIterator[SeededFleet]:
    """Start a fake lupine per planned server (per card of a ``per_gpu`` server), then create
    every Node in ``store``.

    Servers planned on the default port get it when it is free on their address, else a free
    port written into the label; the instances of a ``per_gpu`` server take free ports. The
    lupine servers stop when the block exits; the Nodes stay.
    Raises ``AddressUnavailable`` when an address cannot be bound at all, and whatever the
    store raises for a Node it refuses (the simulated apiserver's ``ApiError``).
    """
    stamp = now or datetime.now(UTC)
    async with open_lupine_fleet() as lupine:
        manifests: list[Manifest] = []
        for server in plan.servers:
            if server.per_gpu:
                fakes = [await lupine.start(server.lupine_spec(0, (c,))) for c in server.cards]
                ports = tuple(fake.port for fake in fakes)
                manifests.append(server.node(port=DEFAULT_LUPINE_PORT, now=stamp, instances=ports))
                continue
            fake = await _start_server(lupine, server)
            manifests.append(server.node(port=fake.port, now=stamp))
        manifests.extend(client.node(now=stamp) for client in plan.clients)
        nodes = tuple(dict(store.create("nodes", node)) for node in manifests)
        yield SeededFleet(plan=plan, lupine=lupine, nodes=nodes)


async def _start_server(lupine: LupineFleet, server: ServerPlan) -> FakeLupine:
    if server.default_port:
        try:
            return await lupine.start(server.lupine_spec(DEFAULT_LUPINE_PORT))
        except AddressUnavailable:
            pass  # another process holds 14833 here; an explicit port label is still HAMi's way
    return await lupine.start(server.lupine_spec(0))
