"""``/bind`` through the real app against kubesim: the commit, the Binding carrying the
annotations, the 409 rules, the claim released at once on a definite refusal in HAMi's flow
and kept for the retry with admission by gate, and kept when the Binding's outcome is
unknown (it may still be applied)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_BOOKING,
    ANNOTATION_ENDPOINT,
    ANNOTATION_TO_ALLOCATE,
)

pytestmark = pytest.mark.anyio

NODE = "gpu-node-1"


@pytest.fixture
def seeded(sim, build, allocator) -> dict[str, Any]:
    """A pending pod in kubesim whose uid holds a booked claim at the allocator."""
    created = build.seed_pod(sim, build.pod())
    allocator.hold(created["metadata"]["uid"])
    return created


def bind_args(the_pod: dict[str, Any], node: str = NODE) -> dict[str, str]:
    meta = the_pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node,
    }


async def post_bind(extender, body: object) -> str:
    response = await extender.client.post("/bind", json=body)
    assert response.status_code == 200
    reply = response.json()
    assert set(reply) == {"Error"}
    return str(reply["Error"])


def stored(sim, name: str = "trainer-0") -> dict[str, Any]:
    return dict(sim.store.get("pods", name, namespace="ml-team"))


async def test_bind_lands_node_and_annotations_in_one_update(
    extender, sim, seeded, allocator
) -> None:
    uid = seeded["metadata"]["uid"]
    version = str(sim.store.resource_version)
    async with sim.store.watch("pods", namespace="ml-team", resource_version=version) as events:
        assert await post_bind(extender, bind_args(seeded)) == ""
        with anyio.fail_after(5):
            event = await anext(aiter(events))
    assert event["type"] == "MODIFIED"
    changed = event["object"]
    assert changed["spec"]["nodeName"] == NODE
    annotations = changed["metadata"]["annotations"]
    assert annotations[ANNOTATION_ENDPOINT] == allocator.endpoint
    assert annotations[ANNOTATION_TO_ALLOCATE] == annotations[ANNOTATION_ALLOCATED]
    assert annotations[ANNOTATION_ALLOCATED].endswith(";")
    assert allocator.commits == [(uid, NODE)]
    assert allocator.released == []
    assert stored(sim)["metadata"]["annotations"] == annotations


async def test_shared_bind_fixture_binds_the_pod_it_names(
    extender, sim, build, allocator, load_fixture
) -> None:
    args = load_fixture("k8s/extender-bind-args.json")
    created = build.seed_pod(sim, build.pod(name=args["PodName"]))
    args["PodUID"] = created["metadata"]["uid"]
    allocator.hold(args["PodUID"])
    assert await post_bind(extender, args) == ""
    assert stored(sim)["spec"]["nodeName"] == args["Node"]
    assert stored(sim)["metadata"]["annotations"][ANNOTATION_ENDPOINT] == allocator.endpoint


async def test_already_bound_to_the_same_node_is_success(extender, sim, seeded, allocator) -> None:
    sim.store.bind("trainer-0", NODE, namespace="ml-team")
    assert await post_bind(extender, bind_args(seeded)) == ""
    assert allocator.released == []


async def test_already_bound_to_another_node_fails_and_releases_the_claim(
    extender, sim, seeded, allocator
) -> None:
    sim.store.bind("trainer-0", "cpu-node-9", namespace="ml-team")
    error = await post_bind(extender, bind_args(seeded))
    assert 'already assigned to node "cpu-node-9"' in error
    assert allocator.released == [seeded["metadata"]["uid"]]


async def test_already_bound_to_another_node_by_an_earlier_attempt_keeps_the_claim(
    extender, sim, seeded, allocator
) -> None:
    annotations = {ANNOTATION_ENDPOINT: "127.0.0.2:14833"}
    sim.store.bind("trainer-0", "cpu-node-9", namespace="ml-team", annotations=annotations)
    error = await post_bind(extender, bind_args(seeded))
    assert 'already assigned to node "cpu-node-9"' in error
    assert "claim is kept" in error
    assert allocator.released == []


@pytest.mark.parametrize("code", [400, 403, 404, 422, 429])
async def test_apiserver_refusal_releases_the_claim_at_once_in_hamis_flow(
    open_extender, sim, seeded, allocator, code: int
) -> None:
    sim.faults.set_error(verb="create", resource="pods/binding", rate=1.0, code=code)
    async with open_extender(RGPU_ADMISSION="filter") as extender:
        error = await post_bind(extender, bind_args(seeded))
    assert f"{code}" in error
    assert allocator.released == [seeded["metadata"]["uid"]]
    assert not stored(sim)["spec"].get("nodeName")


@pytest.fixture
def admitted(sim, build, allocator) -> dict[str, Any]:
    """A pending pod rgpu's admission booked (it carries the booking it lifted the gate with)."""
    booking = '{"server":"gpu-01","expiresAt":4102444800}'
    created = build.seed_pod(sim, build.pod(annotations={ANNOTATION_BOOKING: booking}))
    allocator.hold(created["metadata"]["uid"])
    return created


@pytest.mark.parametrize("code", [400, 429])
async def test_apiserver_refusal_keeps_the_booking_admission_made_for_the_retry(
    extender, sim, admitted, allocator, code: int
) -> None:
    # Admitted behind the gate, in its queue's order and within its quota and gang: a
    # refused Binding must not send the retry round admission through the filter path.
    sim.faults.set_error(verb="create", resource="pods/binding", rate=1.0, code=code)
    error = await post_bind(extender, bind_args(admitted))
    assert f"{code}" in error
    assert "claim is kept (the retry binds on the booking admission made)" in error
    assert allocator.released == []
    assert not stored(sim)["spec"].get("nodeName")
    sim.faults.clear()
    assert await post_bind(extender, bind_args(admitted)) == ""
    assert stored(sim)["spec"]["nodeName"] == NODE


@pytest.mark.parametrize("code", [400, 429])
async def test_apiserver_refusal_releases_a_booking_the_filter_made_on_the_gate_path(
    extender, sim, seeded, allocator, code: int
) -> None:
    # No booking from admission on the pod: its claim came from kube-scheduler's filter, and
    # keeping it would only hold the server from others until it lapses.
    sim.faults.set_error(verb="create", resource="pods/binding", rate=1.0, code=code)
    error = await post_bind(extender, bind_args(seeded))
    assert f"{code}" in error
    assert "claim is kept" not in error
    assert allocator.released == [seeded["metadata"]["uid"]]


@pytest.mark.parametrize("code", [500, 503, 504])
async def test_apiserver_5xx_keeps_the_claim_since_the_binding_may_be_applied(
    extender, sim, seeded, allocator, code: int
) -> None:
    sim.faults.set_error(verb="create", resource="pods/binding", rate=1.0, code=code)
    error = await post_bind(extender, bind_args(seeded))
    assert f"{code}" in error
    assert "claim is kept" in error
    assert allocator.released == []
    assert (
        extender.metric("rgpu_extender_outcomes_total", {"verb": "bind", "outcome": "bind_unknown"})
        == 1
    )


async def test_deleted_pod_releases_the_claim(extender, sim, seeded, allocator) -> None:
    sim.store.delete("pods", "trainer-0", namespace="ml-team")
    error = await post_bind(extender, bind_args(seeded))
    assert "404" in error
    assert allocator.released == [seeded["metadata"]["uid"]]


async def test_recreated_pod_with_the_same_name_is_not_bound(
    extender, sim, build, seeded, allocator
) -> None:
    sim.store.delete("pods", "trainer-0", namespace="ml-team")
    build.seed_pod(sim, build.pod())
    error = await post_bind(extender, bind_args(seeded))
    assert error != ""
    assert not stored(sim)["spec"].get("nodeName")
    assert allocator.released == [seeded["metadata"]["uid"]]


@pytest.mark.parametrize("status", [404, 409])
async def test_claim_not_held_by_the_pod_is_never_bound_nor_released(
    extender, sim, seeded, allocator, status: int
) -> None:
    allocator.commit_status = status
    error = await post_bind(extender, bind_args(seeded))
    assert "holds no claim" in error
    assert not stored(sim)["spec"].get("nodeName")
    assert allocator.released == []


async def test_commit_for_another_pod_uid_is_refused(extender, sim, seeded, allocator) -> None:
    allocator.commit_uid = "someone-else"
    error = await post_bind(extender, bind_args(seeded))
    assert "not " + seeded["metadata"]["uid"] in error
    assert not stored(sim)["spec"].get("nodeName")
    assert allocator.released == []


async def test_commit_without_endpoint_annotation_is_refused_and_released(
    extender, sim, seeded, allocator
) -> None:
    allocator.commit_annotations = {ANNOTATION_ALLOCATED: "x"}
    error = await post_bind(extender, bind_args(seeded))
    assert ANNOTATION_ENDPOINT in error
    assert not stored(sim)["spec"].get("nodeName")
    assert allocator.released == [seeded["metadata"]["uid"]]


async def test_allocator_down_at_commit_answers_error_and_keeps_the_claim(
    extender, sim, seeded, allocator
) -> None:
    allocator.fail = (503, "leases unreadable")
    error = await post_bind(extender, bind_args(seeded))
    assert error.startswith("allocator")
    assert "claim is kept" in error
    assert allocator.released == []
    assert not stored(sim)["spec"].get("nodeName")


async def test_slow_binding_is_cut_at_the_budget_and_keeps_the_claim_of_the_unbound_pod(
    open_extender, sim, seeded, allocator
) -> None:
    sim.faults.set_latency(verb="create", resource="pods/binding", seconds=1.2)
    async with open_extender(RGPU_EXTENDER_BUDGET_SECONDS="0.5") as extender:
        with anyio.fail_after(1):
            error = await post_bind(extender, bind_args(seeded))
    assert "did not finish within the 0.5s budget" in error
    assert "claim is kept" in error
    assert allocator.released == []


async def test_slow_binding_whose_pod_is_gone_releases_the_claim(
    open_extender, sim, seeded, allocator
) -> None:
    sim.faults.set_latency(verb="create", resource="pods/binding", seconds=1.2)
    sim.faults.set_error(verb="get", resource="pods", rate=1.0, code=404)
    async with open_extender(RGPU_EXTENDER_BUDGET_SECONDS="0.5") as extender:
        with anyio.fail_after(1):
            error = await post_bind(extender, bind_args(seeded))
    assert "did not finish within the 0.5s budget" in error
    assert allocator.released == [seeded["metadata"]["uid"]]


async def test_malformed_bind_args_answer_200_with_error(extender) -> None:
    assert "PodUID" in await post_bind(extender, {"PodName": "a", "PodNamespace": "b", "Node": "c"})
    response = await extender.client.post("/bind", content=b"nope")
    assert response.status_code == 200
    assert "not valid JSON" in response.json()["Error"]


async def test_successful_bind_leaves_an_allocated_event_on_the_pod(
    extender, sim, seeded, allocator
) -> None:
    assert await post_bind(extender, bind_args(seeded)) == ""
    event = await wait_event(sim, "RemoteGPUAllocated")
    assert event["involvedObject"]["uid"] == seeded["metadata"]["uid"]
    assert event["source"]["component"] == "rgpu-scheduler"
    assert event["type"] == "Normal"
    assert allocator.server in event["message"]
    assert allocator.endpoint in event["message"]


async def test_failed_bind_leaves_a_warning_event(extender, sim, seeded) -> None:
    sim.store.bind("trainer-0", "cpu-node-9", namespace="ml-team")
    await post_bind(extender, bind_args(seeded))
    event = await wait_event(sim, "RemoteGPUBindFailed")
    assert event["type"] == "Warning"
    assert "cpu-node-9" in event["message"]


async def wait_event(sim, reason: str) -> dict[str, Any]:
    with anyio.fail_after(5):
        while True:
            found = [e for e in sim.store.list("events") if e["reason"] == reason]
            if found:
                return dict(found[0])
            await anyio.sleep(0.01)


async def test_pod_asking_for_no_cards_is_bound_plainly(extender, sim, build, allocator) -> None:
    created = build.seed_pod(sim, build.pod(build.container("web"), name="web-0"))
    assert await post_bind(extender, bind_args(created)) == ""
    bound = stored(sim, "web-0")
    assert bound["spec"]["nodeName"] == NODE
    assert ANNOTATION_ENDPOINT not in (bound["metadata"].get("annotations") or {})
    assert allocator.released == []


async def test_terminating_pod_bound_to_the_node_keeps_its_claim_after_an_unknown_binding(
    extender, sim, seeded, allocator
) -> None:
    annotations = {ANNOTATION_ENDPOINT: "127.0.0.2:14833"}
    sim.store.bind("trainer-0", NODE, namespace="ml-team", annotations=annotations)
    sim.store.delete("pods", "trainer-0", namespace="ml-team")
    assert stored(sim)["metadata"].get("deletionTimestamp")
    sim.faults.set_error(verb="create", resource="pods/binding", rate=1.0, code=503)
    assert await post_bind(extender, bind_args(seeded)) == ""
    assert allocator.released == []


async def test_terminating_pod_bound_elsewhere_by_an_earlier_attempt_keeps_its_claim(
    extender, sim, seeded, allocator
) -> None:
    annotations = {ANNOTATION_ENDPOINT: "127.0.0.2:14833"}
    sim.store.bind("trainer-0", "cpu-node-9", namespace="ml-team", annotations=annotations)
    sim.store.delete("pods", "trainer-0", namespace="ml-team")
    error = await post_bind(extender, bind_args(seeded))
    # kube-apiserver checks the deletion before the node (pods/binding's update function).
    assert "is being deleted, cannot be assigned to a host" in error
    assert allocator.released == []
