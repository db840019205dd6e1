"""Fleet generator: determinism, Node shape as HAMi writes it, real listening ports."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest

from rgpu_contracts.hami import ANNOTATION_REGISTER, LABEL_SERVER, decode_register
from rgpu_kubesim import ApiError, run_apiserver
from rgpu_kubesim._lupine_errors import LupineNotFound, SimOptionError
from rgpu_kubesim.fleet import FleetSpec, ServerPlan, plan_fleet, seed_fleet

pytestmark = pytest.mark.anyio

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
REGISTER_EXAMPLES = (
    Path(__file__).resolve().parents[4] / "fixtures" / "hami" / "node-register-examples.json"
)
TOPOLOGY = ("topology.rgpu.io/rack", "topology.kubernetes.io/zone", "topology.kubernetes.io/region")


class ListStore:
    """Records what seed_fleet creates, like the simulated apiserver's store would."""

    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []

    def create(self, resource: str, obj: dict[str, Any], /) -> dict[str, Any]:
        self.created.append((resource, obj))
        return obj


def label(node: dict[str, Any], key: str) -> str | None:
    value = node["metadata"]["labels"].get(key)
    return None if value is None else str(value)


def internal_ip(node: dict[str, Any]) -> str:
    return str(next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"))


def free_on(address: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


@pytest.fixture
def occupied_default_port() -> Iterator[str]:
    """Hold 14833 on the address that seed 7's first server gets (another simulated fleet of
    seed 7 on this machine may hold it already: taken either way)."""
    address = plan_fleet(FleetSpec(servers=1, clients=0, seed=7)).servers[0].address
    with socket.socket() as holder:
        try:
            holder.bind((address, 14833))
            holder.listen()
        except OSError:
            assert not free_on(address, 14833)
        yield address


def test_same_spec_plans_the_same_fleet() -> None:
    spec = FleetSpec(servers=5, cards=4, clients=7, seed=42, unhealthy_share=0.3)
    assert plan_fleet(spec) == plan_fleet(dataclasses.replace(spec))


def test_different_seeds_plan_different_gpus_and_addresses() -> None:
    one = plan_fleet(FleetSpec(servers=2, seed=1))
    two = plan_fleet(FleetSpec(servers=2, seed=2))
    assert {c.uuid for s in one.servers for c in s.cards}.isdisjoint(
        c.uuid for s in two.servers for c in s.cards
    )
    assert one.servers[0].address != two.servers[0].address


def test_growing_the_fleet_keeps_existing_servers_cards_and_addresses() -> None:
    small = plan_fleet(FleetSpec(servers=2, clients=0, seed=3))
    large = plan_fleet(FleetSpec(servers=6, clients=40, seed=3))
    assert large.servers[:2] == small.servers


def test_addresses_are_distinct_loopback_and_avoid_127_0_0_x() -> None:
    plan = plan_fleet(FleetSpec(servers=40, clients=300, seed=9))
    hosts = [s.address for s in plan.servers] + [c.address for c in plan.clients]
    addresses = [ipaddress.IPv4Address(host) for host in hosts]
    assert len(set(addresses)) == len(addresses)
    assert all(a.is_loopback and a.packed[1] != 0 for a in addresses)
    assert all(a.packed[3] not in (0, 255) for a in addresses)


def test_register_annotation_decodes_to_remote_cards_with_hami_defaults() -> None:
    server = plan_fleet(FleetSpec(servers=1, cards=4, seed=5)).servers[0]
    cards = decode_register(server.register_annotation())
    assert [c.uuid for c in cards] == [c.uuid for c in server.cards]
    assert [c.index for c in cards] == [0, 1, 2, 3]
    assert {(c.memory_mib, c.cores, c.healthy) for c in cards} == {
        (server.model.memory_mib, 100, True)
    }
    assert [c.numa for c in cards] == [0, 0, 1, 1]


def test_register_annotation_writes_keys_like_hamis_device_plugin() -> None:
    example = json.loads(json.loads(REGISTER_EXAMPLES.read_text())["four_remote_a100"])
    server = plan_fleet(FleetSpec(servers=1, cards=4, seed=5)).servers[0]
    ours = json.loads(server.register_annotation())
    assert [list(entry) for entry in ours] == [list(entry) for entry in example]
    assert all(e["count"] == 10 and e["mode"] == "remote" for e in ours)
    assert " " not in ours[0]["type"]


def test_unhealthy_share_one_registers_every_card_unhealthy() -> None:
    server = plan_fleet(FleetSpec(servers=1, unhealthy_share=1.0)).servers[0]
    assert not any(card.healthy for card in decode_register(server.register_annotation()))


def test_shares_of_one_make_every_server_default_port_and_h2only() -> None:
    plan = plan_fleet(FleetSpec(servers=6, default_port_share=1.0, h2only_share=1.0))
    assert all(s.default_port and s.mode == "h2only" for s in plan.servers)
    plan = plan_fleet(FleetSpec(servers=6, default_port_share=0.0))
    assert not any(s.default_port or s.mode == "h2only" for s in plan.servers)


def test_server_node_carries_hami_label_register_and_topology() -> None:
    server = plan_fleet(FleetSpec(servers=1, seed=11)).servers[0]
    node = server.node(port=40001, now=NOW)
    assert label(node, LABEL_SERVER) == "40001"
    assert ANNOTATION_REGISTER in node["metadata"]["annotations"]
    assert internal_ip(node) == server.address
    assert label(node, "kubernetes.io/hostname") == server.name
    assert all(label(node, key) for key in TOPOLOGY)
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert set(node["status"]["allocatable"]) == {"cpu", "memory", "pods"}


def test_default_port_server_gets_an_empty_label_only_on_port_14833() -> None:
    server = dataclasses.replace(_first_server(), default_port=True)
    assert label(server.node(port=14833, now=NOW), LABEL_SERVER) == ""
    assert label(server.node(port=40002, now=NOW), LABEL_SERVER) == "40002"
    explicit = dataclasses.replace(server, default_port=False)
    assert label(explicit.node(port=14833, now=NOW), LABEL_SERVER) == "14833"


def _first_server() -> ServerPlan:
    return plan_fleet(FleetSpec(servers=1, seed=11)).servers[0]


def test_clients_share_the_servers_zones_and_have_no_gpus() -> None:
    plan = plan_fleet(FleetSpec(servers=4, clients=12, seed=4, zones=2, racks_per_zone=2))
    nodes = [c.node(now=NOW) for c in plan.clients]
    assert all(label(n, LABEL_SERVER) is None for n in nodes)
    assert all("annotations" not in n["metadata"] for n in nodes)
    client_racks = {label(n, "topology.rgpu.io/rack") for n in nodes}
    server_racks = {s.placement.rack for s in plan.servers}
    assert client_racks == server_racks
    assert len(server_racks) == 4


def test_planned_nodes_are_valid_kubernetes_objects() -> None:
    plan = plan_fleet(FleetSpec(servers=1, clients=1, seed=2))
    for node in (plan.servers[0].node(port=40003, now=NOW), plan.clients[0].node(now=NOW)):
        kubernetes_validate.validate(node, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("servers", -1),
        ("cards", 0),
        ("zones", 0),
        ("default_port_share", 1.5),
        ("unhealthy_share", -0.1),
        ("region", "Not_DNS"),
        ("server_prefix", "GPU "),
        ("models", ()),
    ],
)
def test_bad_fleet_spec_names_the_field(field: str, value: object) -> None:
    with pytest.raises(SimOptionError) as caught:
        FleetSpec(**{field: value})  # type: ignore[arg-type]
    assert caught.value.field == field


async def test_seed_fleet_creates_nodes_whose_ports_really_listen() -> None:
    plan = plan_fleet(FleetSpec(servers=3, cards=2, clients=2, seed=21, default_port_share=0.0))
    store = ListStore()
    async with seed_fleet(store, plan, now=NOW) as seeded, httpx.AsyncClient() as http:
        assert [resource for resource, _ in store.created] == ["nodes"] * 5
        for node in seeded.nodes[:3]:
            endpoint = f"{internal_ip(node)}:{label(node, LABEL_SERVER)}"
            response = await http.get(f"http://{endpoint}/")
            assert response.text == "lupine\n"
            assert seeded.lupine.by_endpoint(endpoint).name == node["metadata"]["name"]
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://{endpoint}/")


async def test_seeded_lupine_serves_the_planned_gpus_and_mode() -> None:
    plan = plan_fleet(FleetSpec(servers=2, cards=3, clients=0, seed=22, h2only_share=1.0))
    async with seed_fleet(ListStore(), plan, now=NOW) as seeded:
        for server in plan.servers:
            fake = seeded.lupine.by_name(server.name)
            assert [g.uuid for g in fake.gpus] == [c.uuid for c in server.cards]
            assert fake.mode == "h2only"
            assert seeded.endpoints()[server.name] == fake.endpoint
        with pytest.raises(LupineNotFound):
            seeded.lupine.by_name("not-a-server")


async def test_default_port_is_used_when_free_on_the_servers_address() -> None:
    plan = plan_fleet(FleetSpec(servers=1, clients=0, seed=23, default_port_share=1.0))
    assert free_on(plan.servers[0].address, 14833)
    async with seed_fleet(ListStore(), plan, now=NOW) as seeded:
        assert label(seeded.nodes[0], LABEL_SERVER) == ""
        assert seeded.lupine.by_name(plan.servers[0].name).port == 14833


async def test_default_port_taken_falls_back_to_an_explicit_free_port(
    occupied_default_port: str,
) -> None:
    plan = plan_fleet(FleetSpec(servers=1, clients=0, seed=7, default_port_share=1.0))
    async with seed_fleet(ListStore(), plan, now=NOW) as seeded:
        port = label(seeded.nodes[0], LABEL_SERVER)
        assert port not in ("", "14833")
        assert seeded.lupine.by_name(plan.servers[0].name).port == int(str(port))


async def test_seeding_the_simulated_apiserver_stores_ready_labelled_nodes() -> None:
    plan = plan_fleet(FleetSpec(servers=2, cards=2, clients=3, seed=24))
    async with run_apiserver() as sim, seed_fleet(sim.store, plan) as seeded:
        servers = sim.store.list("nodes", label_selector=LABEL_SERVER)
        assert sorted(n["metadata"]["name"] for n in servers) == [s.name for s in plan.servers]
        assert len(sim.store.list("nodes")) == 5
        assert all(n["metadata"]["resourceVersion"] for n in seeded.nodes)


async def test_seeding_the_same_plan_twice_is_refused_by_the_store() -> None:
    plan = plan_fleet(FleetSpec(servers=1, clients=0, seed=25))
    async with run_apiserver() as sim, seed_fleet(sim.store, plan):
        with pytest.raises(ApiError) as caught:
            async with seed_fleet(sim.store, plan):
                pass
    assert caught.value.code == 409


async def test_a_per_gpu_fleet_runs_one_lupine_per_card_declared_on_its_node() -> None:
    from rgpu_contracts.instances import ANNOTATION_INSTANCES, decode_instances

    plan = plan_fleet(FleetSpec(servers=2, cards=3, clients=1, seed=26, per_gpu=True))
    async with seed_fleet(ListStore(), plan, now=NOW) as seeded:
        node = seeded.nodes[0]
        server = plan.servers[0]
        instances = decode_instances(node["metadata"]["annotations"][ANNOTATION_INSTANCES])
        assert [i.gpus for i in instances] == [(c.uuid,) for c in server.cards]
        for instance in instances:
            fake = seeded.lupine.by_name(f"{server.name}@{instance.port}")
            assert (fake.node, fake.port) == (server.name, instance.port)
            assert [g.uuid for g in fake.gpus] == list(instance.gpus)
        assert len(seeded.endpoints()) == 6
        assert label(node, LABEL_SERVER) is not None
