"""A fleet view updated for a newer fleet is the view built from scratch for it: the reused
facts and locality index never show a server as it was."""

from __future__ import annotations

import dataclasses

import pytest

from rgpu_contracts import NodeName
from rgpu_placement import FleetView

KEYS = ("rack", "zone")
NODES = {"client-1": {"rack": "r1", "zone": "a"}, "client-2": {"rack": "r2", "zone": "b"}}


def same(updated: FleetView, built: FleetView) -> None:
    assert updated.fleet == built.fleet
    assert updated.facts == built.facts
    assert [f.name for f in updated.order] == [f.name for f in built.order]
    assert updated.domains == built.domains
    assert updated.node_paths == built.node_paths
    assert updated.cards == built.cards
    assert updated.server_nodes == built.server_nodes
    assert updated.total_cards == built.total_cards


@pytest.fixture
def servers(make):
    return [
        make.server("gpu-a", labels={"rack": "r1", "zone": "a"}),
        make.server("gpu-b", labels={"rack": "r2", "zone": "b"}, cards=2),
        make.server("gpu-c", labels={"rack": "r1", "zone": "b"}),
    ]


def build(make, servers) -> FleetView:
    return FleetView.build(make.fleet(*servers), make.topology(NODES), KEYS)


def test_a_server_turning_busy_updates_its_facts_and_keeps_the_others(make, servers) -> None:
    before = build(make, servers)
    changed = [
        servers[0],
        make.server("gpu-b", busy=[1], unhealthy=[0], cards=2, labels={"rack": "r2", "zone": "b"}),
        servers[2],
    ]
    updated = before.with_fleet(make.fleet(*changed))
    same(updated, build(make, changed))
    assert updated.facts["gpu-a"] is before.facts["gpu-a"]
    assert updated.facts["gpu-b"] is not before.facts["gpu-b"]


def test_a_server_moving_rack_rebuilds_the_locality_index(make, servers) -> None:
    moved = [servers[0], servers[1], make.server("gpu-c", labels={"rack": "r2", "zone": "b"})]
    updated = build(make, servers).with_fleet(make.fleet(*moved))
    same(updated, build(make, moved))


@pytest.mark.parametrize("change", ["added", "removed", "renamed"])
def test_servers_joining_or_leaving_rebuild_the_view(make, servers, change) -> None:
    other = make.server("gpu-d", labels={"rack": "r1", "zone": "a"})
    fleets = {
        "added": [*servers, other],
        "removed": servers[:2],
        "renamed": [*servers[:2], other],
    }
    updated = build(make, servers).with_fleet(make.fleet(*fleets[change]))
    same(updated, build(make, fleets[change]))


def test_fresh_server_states_go_through_the_same_update(make, servers) -> None:
    fresh = make.server("gpu-a", busy=[0, 1], labels={"rack": "r1", "zone": "a"})
    updated = build(make, servers).with_servers([fresh, make.server("unknown")])
    same(updated, build(make, [fresh, *servers[1:]]))


def test_server_nodes_name_each_servers_node_once_and_no_client(make, servers) -> None:
    per_gpu = [
        dataclasses.replace(make.server(f"big-{i}"), node=NodeName("big-node")) for i in range(2)
    ]
    view = build(make, [*servers, *per_gpu])
    assert view.server_nodes == {"gpu-a", "gpu-b", "gpu-c", "big-node"}
    assert view.with_topology(make.topology({})).server_nodes == view.server_nodes
