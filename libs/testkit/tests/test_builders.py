from __future__ import annotations

from rgpu_contracts import AllocationRequest, Claim, ClaimState, Fleet, Server, Topology
from rgpu_testkit import (
    allocation_request,
    card,
    claim,
    claim_set,
    container_manifest,
    container_request,
    fleet,
    node_manifest,
    pod_manifest,
    pod_ref,
    register_annotation,
    register_card,
    server,
    topology,
)


def test_card_ids_follow_server_and_index() -> None:
    made = card(server="gpu-b", index=3)
    assert (made.id, made.uuid, made.healthy) == ("gpu-b/GPU-gpu-b-3", "GPU-gpu-b-3", True)


def test_server_marks_busy_and_unhealthy_cards_by_index() -> None:
    made = server(name="gpu-a", cards=3, busy=[0], unhealthy=[2], labels={"zone": "a"})
    assert made.busy == {"GPU-gpu-a-0"}
    assert [c.healthy for c in made.cards] == [True, True, False]
    assert made.topology == (("zone", "a"),)
    assert made.endpoint == "10.0.0.5:14833"


def test_server_takes_one_card_per_memory_size_and_an_explicit_endpoint() -> None:
    made = server(memory_mib=[1000, 2000], endpoint=None)
    assert [c.memory_mib for c in made.cards] == [1000, 2000]
    assert made.endpoint is None


def test_contract_values_round_trip_through_their_wire_form() -> None:
    made = fleet(servers=[server(), server(name="gpu-b")], revision=4)
    assert Fleet.from_dict(made.to_dict()) == made
    assert Server.from_dict(made.servers[0].to_dict()) == made.servers[0]
    places = topology(nodes={"n1": {"rack": "r1"}}, revision=2)
    assert Topology.from_dict(places.to_dict()) == places
    request = allocation_request(containers=[container_request(count=2)], candidates=["n1"])
    assert AllocationRequest.from_dict(request.to_dict()) == request
    held = claim(cards=[0, 1], state="bound", containers={"main": [0, 1]}, node="n1")
    assert Claim.from_dict(held.to_dict()) == held
    assert held.state is ClaimState.BOUND
    assert claim_set(claims=[held], revision=3).claims == (held,)


def test_pod_ref_defaults_its_uid_from_the_name() -> None:
    assert pod_ref(name="train").uid == "uid-train"


def test_pod_manifest_is_a_minimal_valid_pod_with_what_was_asked() -> None:
    pod = pod_manifest(
        name="t",
        namespace="ml",
        scheduler="rgpu-scheduler",
        annotations={"a": "b"},
        containers=[container_manifest(limits={"nvidia.com/remote-gpu": "1"})],
        spec={"priority": 5},
    )
    assert pod["metadata"] == {"name": "t", "namespace": "ml", "annotations": {"a": "b"}}
    assert pod["spec"]["schedulerName"] == "rgpu-scheduler"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/remote-gpu": "1"}
    assert pod["spec"]["priority"] == 5


def test_node_manifest_is_ready_with_optional_address_and_taints() -> None:
    node = node_manifest(name="n1", address="127.0.0.2", taints=[{"key": "k"}], ready="Unknown")
    assert node["status"]["conditions"][0]["status"] == "Unknown"
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "127.0.0.2"}]
    assert node["spec"] == {"taints": [{"key": "k"}]}
    assert node_manifest()["status"]["conditions"][0]["status"] == "True"


def test_register_annotation_is_compact_json_of_the_cards() -> None:
    value = register_annotation([register_card(uuid="GPU-x", index=1, healthy=False)])
    assert value.startswith('[{"id":"GPU-x","index":1,')
    assert '"health":false' in value
