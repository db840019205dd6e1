"""``/prioritize``: candidates scored by topology closeness to the pod's claimed server."""

from __future__ import annotations

from typing import Any

import pytest

from rgpu_contracts import NoFit
from rgpu_extender.scoring import closeness
from rgpu_runtime.feeds import Versioned
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

UID = "8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f"
RACK, ZONE, REGION = (
    "topology.rgpu.io/rack",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
)
KEYS = (RACK, ZONE, REGION)


async def scores(extender, body: object) -> dict[str, int]:
    response = await extender.client.post("/prioritize", json=body)
    assert response.status_code == 200
    reply = response.json()
    assert isinstance(reply, list)
    assert all(set(entry) == {"Host", "Score"} for entry in reply)
    return {entry["Host"]: entry["Score"] for entry in reply}


async def test_shared_fixture_scores_the_node_in_the_servers_rack_highest(
    extender, allocator, load_fixture
) -> None:
    allocator.hold(UID)
    reply = await scores(extender, load_fixture("k8s/extender-prioritize-args.json"))
    assert reply == {"gpu-node-1": 10, "gpu-node-2": 0}


async def test_each_shared_domain_scores_rack_zone_region_else_zero(
    extender, allocator, build
) -> None:
    allocator.hold(UID)
    nodes = ["gpu-node-1", "cpu-node-1", "cpu-node-2", "cpu-node-3", "unknown"]
    reply = await scores(extender, build.filter_args(build.pod(), nodes))
    assert reply == {
        "gpu-node-1": 10,
        "cpu-node-1": 5,
        "cpu-node-2": 2,
        "cpu-node-3": 0,
        "unknown": 0,
    }


async def test_order_of_candidates_is_kept(extender, allocator, build) -> None:
    allocator.hold(UID)
    nodes = ["cpu-node-2", "gpu-node-1", "cpu-node-1"]
    response = await extender.client.post("/prioritize", json=build.filter_args(build.pod(), nodes))
    assert [e["Host"] for e in response.json()] == nodes


async def test_pod_without_a_claim_scores_every_node_zero(extender, build) -> None:
    reply = await scores(extender, build.filter_args(build.pod(), ["gpu-node-1", "cpu-node-1"]))
    assert reply == {"gpu-node-1": 0, "cpu-node-1": 0}


async def test_unreachable_allocator_scores_every_node_zero(extender, allocator, build) -> None:
    allocator.hold(UID)
    allocator.fail = (503, "down")
    reply = await scores(extender, build.filter_args(build.pod(), ["gpu-node-1"]))
    assert reply == {"gpu-node-1": 0}


async def test_claim_on_a_server_discovery_no_longer_lists_scores_zero(
    extender, allocator, build
) -> None:
    allocator.server = "gone-server"
    allocator.hold(UID)
    reply = await scores(extender, build.filter_args(build.pod(), ["gpu-node-1"]))
    assert reply == {"gpu-node-1": 0}


async def test_full_nodes_are_scored_by_their_own_labels(extender, allocator, build) -> None:
    allocator.hold(UID)
    items: list[dict[str, Any]] = [
        {"metadata": {"name": "fresh", "labels": {RACK: "r1", ZONE: "z1", REGION: "eu"}}},
        {"metadata": {"name": "gpu-node-1", "labels": {}}},
    ]
    body = {"Pod": build.pod(), "Nodes": {"items": items}, "NodeNames": None}
    assert await scores(extender, body) == {"fresh": 10, "gpu-node-1": 0}


async def test_a_node_in_the_servers_zone_beats_one_in_a_same_named_rack_of_another_zone(
    extender, allocator, build
) -> None:
    allocator.hold(UID)  # on gpu-node-2: rack r1, zone z1, region eu
    items: list[dict[str, Any]] = [
        {"metadata": {"name": "r1-other-zone", "labels": {RACK: "r1", ZONE: "z2", REGION: "eu"}}},
        {"metadata": {"name": "r2-same-zone", "labels": {RACK: "r2", ZONE: "z1", REGION: "eu"}}},
    ]
    body = {"Pod": build.pod(), "Nodes": {"items": items}, "NodeNames": None}
    assert await scores(extender, body) == {"r1-other-zone": 2, "r2-same-zone": 5}


async def test_configured_topology_keys_are_used(open_extender, allocator, build) -> None:
    allocator.hold(UID)
    async with open_extender(RGPU_TOPOLOGY_KEYS=REGION) as extender:
        reply = await scores(extender, build.filter_args(build.pod(), ["cpu-node-2", "cpu-node-3"]))
    assert reply == {"cpu-node-2": 10, "cpu-node-3": 0}


async def test_a_pod_this_replica_just_filtered_is_scored_without_asking_the_allocator(
    extender, allocator, build
) -> None:
    nodes = ["gpu-node-1", "cpu-node-1", "cpu-node-2"]
    filtered = await extender.client.post("/filter", json=build.filter_args(build.pod(), nodes))
    assert filtered.json()["NodeNames"] == nodes
    asked = len(allocator.headers)
    reply = await scores(extender, build.filter_args(build.pod(), nodes))
    assert reply == {"gpu-node-1": 10, "cpu-node-1": 5, "cpu-node-2": 2}
    assert len(allocator.headers) == asked


async def test_a_pod_refused_since_its_last_booking_is_looked_up_at_the_allocator(
    extender, allocator, build
) -> None:
    args = build.filter_args(build.pod(), ["gpu-node-1"])
    await extender.client.post("/filter", json=args)
    allocator.no_fit = NoFit(reasons=(), total=4)
    allocator.claims.clear()
    refused = await extender.client.post("/filter", json=args)
    assert refused.json()["FailedNodes"]
    assert await scores(extender, args) == {"gpu-node-1": 0}


async def test_many_candidates_sharing_a_few_label_sets_are_each_scored_by_their_own(
    open_extender, allocator, discovery, make, build
) -> None:
    allocator.hold(UID)
    profiles = [
        {RACK: "r1", ZONE: "z1", REGION: "eu"},
        {RACK: "r2", ZONE: "z1", REGION: "eu"},
        {RACK: "r1", ZONE: "z2", REGION: "eu"},
        {},
    ]
    nodes = {f"client-{i:03d}": profiles[i % 4] for i in range(300)}
    topology = make.topology(nodes, revision=2)
    discovery.topologies = Versioned(topology, revision=topology.revision)
    async with open_extender() as extender:
        reply = await scores(extender, build.filter_args(build.pod(), nodes))
    assert reply == {name: (10, 5, 2, 0)[i % 4] for i, name in enumerate(nodes)}


async def test_malformed_prioritize_body_is_a_400_error_body(extender) -> None:
    response = await extender.client.post("/prioritize", json={"Nodes": None})
    assert response.status_code == 400
    assert response.json()["code"] == "bad_request"
    assert "Pod" in response.json()["message"]


def test_a_shared_rack_name_in_another_zone_is_not_close() -> None:
    server = {RACK: "r1", ZONE: "z1", REGION: "eu"}
    assert closeness(server, {RACK: "r1", ZONE: "z2", REGION: "eu"}, KEYS) == 2


def test_a_missing_coarser_label_does_not_veto_a_shared_rack() -> None:
    assert closeness({RACK: "r1", ZONE: "z1"}, {RACK: "r1"}, KEYS) == 10


def test_keys_beyond_the_third_score_one() -> None:
    keys = (*KEYS, "topology.example.com/campus")
    assert closeness({keys[3]: "c"}, {keys[3]: "c"}, keys) == 1


def test_nothing_shared_scores_zero() -> None:
    assert closeness({RACK: "r1"}, {ZONE: "z1"}, KEYS) == 0


async def test_scores_remembered_for_one_pod_follow_a_relabelled_node_for_the_next(
    open_extender, allocator, discovery, make, build
) -> None:
    allocator.hold(UID)  # on gpu-node-2: rack r1, zone z1, region eu
    same_rack = {RACK: "r1", ZONE: "z1", REGION: "eu"}
    nodes = {"client-a": same_rack, "client-b": {REGION: "eu"}}
    discovery.publish_topology(make.topology(nodes, revision=2))
    async with open_extender() as extender:
        args = build.filter_args(build.pod(), list(nodes))
        first = await scores(extender, args)
        assert await scores(extender, args) == first == {"client-a": 10, "client-b": 2}
        moved = {"client-a": {REGION: "us"}, "client-b": same_rack}
        discovery.publish_topology(make.topology(moved, revision=3))

        async def relabelled() -> bool:
            return await scores(extender, args) == {"client-a": 0, "client-b": 10}

        await eventually(relabelled, what="the new labels scored")
