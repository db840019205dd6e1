from __future__ import annotations

import orjson
import pytest

from rgpu_contracts import Topology
from rgpu_discovery.topology import TopologyState

RACK = "topology.rgpu.io/rack"
ZONE = "topology.kubernetes.io/zone"


@pytest.fixture
def topology() -> TopologyState:
    return TopologyState()


@pytest.fixture
def client(build):
    def make(name: str = "node-1", labels: dict[str, str] | None = None):
        return build.view(build.node(name, server=None, labels=labels))

    return make


def test_first_list_publishes_every_client_node_sorted(topology: TopologyState, client) -> None:
    before = topology.snapshot().revision
    topology.replace_all([client("node-2"), client("node-1", {RACK: "r1", "x": "y"})])
    assert topology.snapshot().revision == before + 1
    nodes = topology.topology().nodes
    assert [(n.name, n.labels) for n in nodes] == [("node-1", ((RACK, "r1"),)), ("node-2", ())]


def test_body_decodes_as_the_topology_contract(topology: TopologyState, client) -> None:
    topology.replace_all([client("node-1", {ZONE: "z"})])
    assert Topology.from_dict(orjson.loads(topology.snapshot().body())) == topology.topology()


def test_unrelated_relabel_does_not_move_revision(topology: TopologyState, client) -> None:
    topology.replace_all([client("node-1", {RACK: "r1"})])
    revision = topology.snapshot().revision
    assert not topology.apply(client("node-1", {RACK: "r1", "team": "ml"}))
    topology.replace_all([client("node-1", {RACK: "r1", "team": "infra"})])
    assert topology.snapshot().revision == revision


def test_topology_label_change_moves_revision(topology: TopologyState, client) -> None:
    topology.replace_all([client("node-1", {RACK: "r1"})])
    revision = topology.snapshot().revision
    assert topology.apply(client("node-1", {RACK: "r2"}))
    assert topology.snapshot().revision == revision + 1


def test_node_appearing_and_disappearing_moves_revision(topology: TopologyState, client) -> None:
    topology.replace_all([])
    revision = topology.snapshot().revision
    topology.apply(client("node-9"))
    assert topology.remove("node-9")
    assert not topology.remove("node-9")
    topology.replace_all([client("node-3")])
    topology.replace_all([])
    assert topology.snapshot().revision == revision + 4
