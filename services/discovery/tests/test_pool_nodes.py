"""How a server Node becomes servers of the fleet: cordons, device cordons, and lupine
instances (one per GPU), as the Node watch delivers them."""

from __future__ import annotations

from typing import Any

import pytest

from rgpu_contracts.hami import ANNOTATION_DEVICE_CORDON
from rgpu_contracts.instances import ANNOTATION_INSTANCES
from rgpu_discovery.clients import NodeEvent
from rgpu_discovery.fleet import FleetState
from rgpu_discovery.nodes import REASON_BAD_INSTANCES, NodeNotices
from rgpu_discovery.topology import TopologyState
from rgpu_discovery.watching import Catalog

INSTANCES = '[{"port":14834,"gpus":["GPU-0"]},{"port":14835,"gpus":["GPU-1","GPU-2"]}]'


@pytest.fixture
def events() -> list[NodeEvent]:
    return []


@pytest.fixture
def catalog(build, events: list[NodeEvent]) -> Catalog:
    return Catalog(
        fleet=FleetState(default_port=14833),
        topology=TopologyState(),
        notices=NodeNotices(default_port=14833, emit=events.append),
        topology_keys=build.keys,
    )


def gpu_node(build, *, instances: str | None = None, cordon: str | None = None, **kw: Any):
    cards = build.register(*(build.card(f"GPU-{i}", i) for i in range(4)))
    node = build.node("gpu-a", annotation=cards, **kw)
    annotations = node["metadata"]["annotations"]
    if instances is not None:
        annotations[ANNOTATION_INSTANCES] = instances
    if cordon is not None:
        annotations[ANNOTATION_DEVICE_CORDON] = cordon
    return node


def servers(catalog: Catalog):
    return {s.name: s for s in catalog.fleet.fleet().servers}


def test_a_cordoned_node_is_a_cordoned_server_and_uncordoning_publishes_again(
    catalog: Catalog, build
) -> None:
    node = gpu_node(build)
    node["spec"] = {"unschedulable": True}
    catalog.relist([node])
    assert servers(catalog)["gpu-a"].cordoned
    before = catalog.fleet.published.revision
    node["spec"] = {}
    catalog.observe("MODIFIED", node)
    assert not servers(catalog)["gpu-a"].cordoned
    assert catalog.fleet.published.revision > before


def test_device_cordon_marks_exactly_the_listed_cards(catalog: Catalog, build) -> None:
    catalog.relist([gpu_node(build, cordon="GPU-1, GPU-3,GPU-unknown,")])
    cards = servers(catalog)["gpu-a"].cards
    assert [c.cordoned for c in cards] == [False, True, False, True]
    assert not servers(catalog)["gpu-a"].cordoned


def test_each_lupine_instance_is_a_server_with_its_port_and_cards(catalog: Catalog, build) -> None:
    catalog.relist([gpu_node(build, instances=INSTANCES, server="14833")])
    found = servers(catalog)
    assert sorted(found) == ["gpu-a@14834", "gpu-a@14835"]
    second = found["gpu-a@14835"]
    assert (second.node, second.endpoint, second.port) == ("gpu-a", "10.0.0.1:14835", 14835)
    assert [c.id for c in second.cards] == ["gpu-a@14835/GPU-1", "gpu-a@14835/GPU-2"]
    assert all(c.server == "gpu-a@14835" for c in second.cards)
    assert found["gpu-a@14834"].error is None


def test_instances_share_their_node_s_cordons(catalog: Catalog, build) -> None:
    node = gpu_node(build, instances=INSTANCES, cordon="GPU-2")
    node["spec"] = {"unschedulable": True}
    catalog.relist([node])
    found = servers(catalog)
    assert all(s.cordoned for s in found.values())
    assert [c.cordoned for c in found["gpu-a@14835"].cards] == [False, True]


def test_dropping_the_annotation_turns_the_instances_back_into_one_server(
    catalog: Catalog, build
) -> None:
    catalog.relist([gpu_node(build, instances=INSTANCES)])
    catalog.observe("MODIFIED", gpu_node(build))
    assert list(servers(catalog)) == ["gpu-a"]
    catalog.observe("MODIFIED", gpu_node(build, instances=INSTANCES))
    assert sorted(servers(catalog)) == ["gpu-a@14834", "gpu-a@14835"]


@pytest.mark.parametrize("gone", ["DELETED", "client"])
def test_a_node_that_goes_takes_all_its_instances_with_it(catalog: Catalog, build, gone) -> None:
    catalog.relist([gpu_node(build, instances=INSTANCES), build.node("gpu-b")])
    if gone == "DELETED":
        catalog.observe("DELETED", gpu_node(build, instances=INSTANCES))
    else:
        catalog.observe("MODIFIED", gpu_node(build, instances=INSTANCES, server=None))
    assert list(servers(catalog)) == ["gpu-b"]


def test_an_instance_listing_an_unregistered_gpu_says_so(catalog: Catalog, build) -> None:
    text = '[{"port":14834,"gpus":["GPU-0","GPU-9"]}]'
    catalog.relist([gpu_node(build, instances=text)])
    server = servers(catalog)["gpu-a@14834"]
    assert [c.uuid for c in server.cards] == ["GPU-0"]
    assert server.error is not None and "GPU-9" in server.error


def test_an_unusable_instances_annotation_lists_the_node_without_cards_and_tells_once(
    catalog: Catalog, build, events: list[NodeEvent]
) -> None:
    bad = '[{"port":14834,"gpus":["GPU-0"]},{"port":14834,"gpus":["GPU-1"]}]'
    catalog.relist([gpu_node(build, instances=bad)])
    catalog.observe("MODIFIED", gpu_node(build, instances=bad, ready="False"))
    server = servers(catalog)["gpu-a"]
    assert server.cards == ()
    assert server.error is not None and "rgpu.io/lupine-instances" in server.error
    assert [(e.node, e.reason) for e in events] == [("gpu-a", REASON_BAD_INSTANCES)]
    assert "used twice" in events[0].message
