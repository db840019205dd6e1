from __future__ import annotations

import logging

import pytest

from rgpu_discovery.clients import NodeEvent
from rgpu_discovery.fleet import FleetState
from rgpu_discovery.nodes import REASON_BAD_REGISTER, NodeNotices
from rgpu_discovery.topology import TopologyState
from rgpu_discovery.watching import Catalog


@pytest.fixture
def events() -> list[NodeEvent]:
    return []


@pytest.fixture
def catalog(build, events: list[NodeEvent]) -> Catalog:
    notices = NodeNotices(default_port=14833, emit=events.append)
    return Catalog(
        fleet=FleetState(default_port=14833),
        topology=TopologyState(),
        notices=notices,
        topology_keys=build.keys,
    )


def names(catalog: Catalog) -> tuple[list[str], list[str]]:
    return (
        [s.name for s in catalog.fleet.fleet().servers],
        [n.name for n in catalog.topology.topology().nodes],
    )


def test_relist_splits_servers_from_client_nodes(catalog: Catalog, build) -> None:
    catalog.relist([build.node("gpu-a"), build.node("node-1", server=None), {"metadata": {}}])
    assert names(catalog) == (["gpu-a"], ["node-1"])


def test_node_gaining_the_server_label_moves_from_topology_to_fleet(
    catalog: Catalog, build
) -> None:
    catalog.relist([build.node("node-1", server=None)])
    catalog.observe("MODIFIED", build.node("node-1", server=""))
    assert names(catalog) == (["node-1"], [])
    catalog.observe("MODIFIED", build.node("node-1", server=None))
    assert names(catalog) == ([], ["node-1"])


def test_deleted_node_leaves_both(catalog: Catalog, build) -> None:
    catalog.relist([build.node("gpu-a"), build.node("node-1", server=None)])
    catalog.observe("DELETED", build.node("gpu-a"))
    catalog.observe("DELETED", build.node("node-1", server=None))
    catalog.observe("DELETED", {"metadata": {}})
    assert names(catalog) == ([], [])


def test_garbage_register_emits_one_event_per_distinct_error(
    catalog: Catalog, build, events: list[NodeEvent]
) -> None:
    catalog.relist([build.node("gpu-a", annotation="{not json")])
    catalog.observe("MODIFIED", build.node("gpu-a", annotation="{not json", ready="False"))
    catalog.relist([build.node("gpu-a", annotation="{not json")])
    assert [(e.node, e.uid, e.reason) for e in events] == [
        ("gpu-a", "uid-gpu-a", REASON_BAD_REGISTER)
    ]
    catalog.observe("MODIFIED", build.node("gpu-a", annotation="[1]"))
    assert len(events) == 2
    assert "hami.io/node-nvidia-register" in events[1].message


def test_recreated_node_with_same_garbage_is_reported_again(
    catalog: Catalog, build, events: list[NodeEvent]
) -> None:
    catalog.observe("ADDED", build.node("gpu-a", annotation="{not json"))
    catalog.observe("DELETED", build.node("gpu-a", annotation="{not json"))
    catalog.observe("ADDED", build.node("gpu-a", annotation="{not json", uid="uid-2"))
    assert [e.uid for e in events] == ["uid-gpu-a", "uid-2"]


def test_port_fallback_is_logged_once_per_node_and_value(
    catalog: Catalog, build, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rgpu_discovery.nodes")
    for label in ("not-a-port", "not-a-port", "70000", "not-a-port", "24000"):
        catalog.observe("MODIFIED", build.node("gpu-a", server=label))
    logged = [(r.node, r.getMessage()) for r in caplog.records]
    assert len(logged) == 2
    assert all(node == "gpu-a" for node, _ in logged)
    assert "'not-a-port'" in logged[0][1]
    assert "'70000'" in logged[1][1]


def test_empty_port_label_is_logged_at_info_not_warning(
    catalog: Catalog, build, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rgpu_discovery.nodes")
    catalog.observe("ADDED", build.node("gpu-a", server=""))
    assert [r.levelno for r in caplog.records] == [logging.INFO]
