"""``/filter`` through the real app: every branch, with the allocator and discovery faked at
their transports and the apiserver simulated by kubesim."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from rgpu_contracts import ContainerKind

pytestmark = pytest.mark.anyio

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
NODES = ["gpu-node-1", "gpu-node-2", "cpu-node-1"]
SERVER_REASON = "node serves the remote GPU pool"


async def post_filter(extender, body: object) -> dict[str, Any]:
    response = await extender.client.post("/filter", json=body)
    assert response.status_code == 200
    reply = response.json()
    assert set(reply) == FILTER_KEYS
    return dict(reply)


async def test_shared_fixture_books_and_keeps_every_client_node(
    extender, allocator, load_fixture
) -> None:
    reply = await post_filter(extender, load_fixture("k8s/extender-filter-args.json"))
    assert reply["Error"] == ""
    assert reply["NodeNames"] == ["gpu-node-1", "cpu-node-1"]
    assert reply["FailedNodes"] is None
    assert list(reply["FailedAndUnresolvableNodes"]) == ["gpu-node-2"]
    assert SERVER_REASON in reply["FailedAndUnresolvableNodes"]["gpu-node-2"]
    (request,) = allocator.requests
    assert request.pod.uid == "8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f"
    assert request.pod.key == "ml-team/trainer-0"
    assert request.candidate_nodes == ("gpu-node-1", "cpu-node-1")
    assert [(c.name, c.count) for c in request.containers] == [("main", 1)]


async def test_allocator_is_asked_with_every_container_in_pod_order(
    extender, allocator, build
) -> None:
    the_pod = build.pod(
        build.container("app", count="2", memory="30000"),
        build.container("logs"),
        init=[build.container("warm", count="1"), build.container("mesh", restartPolicy="Always")],
    )
    await post_filter(extender, build.filter_args(the_pod, ["gpu-node-1"]))
    (request,) = allocator.requests
    assert [(c.name, c.kind, c.count, c.memory_mib) for c in request.containers] == [
        ("warm", ContainerKind.INIT, 1, 0),
        ("mesh", ContainerKind.SIDECAR, 0, 0),
        ("app", ContainerKind.APP, 2, 30000),
        ("logs", ContainerKind.APP, 0, 0),
    ]


async def test_pod_asking_for_nothing_passes_through_without_a_call(
    extender, allocator, build
) -> None:
    the_pod = build.pod(build.container("web"))
    reply = await post_filter(extender, build.filter_args(the_pod, NODES))
    assert reply == {
        "Nodes": None,
        "NodeNames": NODES,
        "FailedNodes": None,
        "FailedAndUnresolvableNodes": None,
        "Error": "",
    }
    assert allocator.requests == []


@pytest.mark.parametrize("value", ["1.5", "-1", "2Gi", "1e3", "2147483648"])
async def test_invalid_quantity_rejects_the_pod_on_every_node(
    extender, allocator, build, value: str
) -> None:
    the_pod = build.pod(build.container("trainer", count=value))
    reply = await post_filter(extender, build.filter_args(the_pod, NODES))
    failed = reply["FailedAndUnresolvableNodes"]
    assert set(failed) == set(NODES)
    assert all('container "trainer"' in m and repr(value) in m for m in failed.values())
    assert reply["NodeNames"] == []
    assert reply["Error"] == ""
    assert allocator.requests == []


async def test_pod_without_webhook_wiring_is_rejected_saying_the_webhook_is_missing(
    extender, allocator, build
) -> None:
    the_pod = build.pod(build.container("trainer", count="1", wired=False))
    reply = await post_filter(extender, build.filter_args(the_pod, NODES))
    failed = reply["FailedAndUnresolvableNodes"]
    assert set(failed) == set(NODES)
    assert all("not mutated by the rgpu admission webhook" in m for m in failed.values())
    assert allocator.requests == []


async def test_literal_endpoint_env_counts_as_unwired(extender, build) -> None:
    env = [{"name": "LUPINE_SERVER", "value": "10.0.0.1:14833"}]
    the_pod = build.pod(build.container("trainer", count="1", env=env))
    reply = await post_filter(extender, build.filter_args(the_pod, ["gpu-node-1"]))
    assert "webhook" in reply["FailedAndUnresolvableNodes"]["gpu-node-1"]


async def test_only_server_candidates_fail_unresolvable_without_asking(
    extender, allocator, build
) -> None:
    reply = await post_filter(extender, build.filter_args(build.pod(), ["gpu-node-2", "lupine-b"]))
    assert reply["NodeNames"] == []
    assert set(reply["FailedAndUnresolvableNodes"]) == {"gpu-node-2", "lupine-b"}
    assert allocator.requests == []


async def test_no_fit_fails_every_candidate_with_hamis_reason(
    extender, allocator, build, make
) -> None:
    allocator.no_fit = make.no_fit()
    reply = await post_filter(extender, build.filter_args(build.pod(), NODES))
    reason = "2/4 CardInsufficientMemory, 2/4 ExclusiveDeviceAllocateConflict"
    assert reply["FailedNodes"] == {"gpu-node-1": reason, "cpu-node-1": reason}
    assert list(reply["FailedAndUnresolvableNodes"]) == ["gpu-node-2"]
    assert reply["NodeNames"] == []
    assert reply["Error"] == ""


@pytest.mark.parametrize(
    "fault",
    [
        {"fail": (503, "leases unreadable")},
        {"fail": (500, "bug")},
        {"raise_error": httpx.ConnectError("refused")},
        {"raise_error": httpx.ReadTimeout("slow")},
    ],
    ids=["503", "500", "refused", "timeout"],
)
async def test_allocator_failure_answers_error_for_a_retry(
    extender, allocator, build, fault: dict[str, Any]
) -> None:
    for key, value in fault.items():
        setattr(allocator, key, value)
    reply = await post_filter(extender, build.filter_args(build.pod(), NODES))
    assert reply["Error"].startswith("allocator")
    assert reply["NodeNames"] is None
    assert reply["FailedNodes"] is None


async def test_slow_allocator_answers_error_within_the_budget(
    open_extender, allocator, build
) -> None:
    allocator.delay = 5.0
    async with open_extender(RGPU_EXTENDER_BUDGET_SECONDS="0.2") as extender:
        with anyio.fail_after(2):
            reply = await post_filter(extender, build.filter_args(build.pod(), NODES))
    assert "did not answer within 0.2s" in reply["Error"]


async def test_full_nodes_are_answered_as_nodes_filtered(extender, build) -> None:
    items = [{"metadata": {"name": n, "labels": {"a": "b"}}} for n in NODES]
    body = {"Pod": build.pod(), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    reply = await post_filter(extender, body)
    assert reply["NodeNames"] is None
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["gpu-node-1", "cpu-node-1"]
    assert reply["Nodes"]["items"][0] == items[0]


async def test_full_nodes_of_a_pod_asking_nothing_come_back_unchanged(extender, build) -> None:
    items = [{"metadata": {"name": n}} for n in NODES]
    body = {"Pod": build.pod(build.container()), "Nodes": {"items": items}, "NodeNames": None}
    reply = await post_filter(extender, body)
    assert reply["Nodes"] == {"items": items}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "invalid ExtenderArgs"),
        (b'{"NodeNames": ["a"]}', "Pod: is required"),
        (b'{"Pod": {}, "NodeNames": "a"}', "NodeNames"),
    ],
)
async def test_malformed_body_answers_200_with_error(extender, body: bytes, fragment: str) -> None:
    response = await extender.client.post(
        "/filter", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    reply = response.json()
    assert set(reply) == FILTER_KEYS
    assert fragment in reply["Error"]


async def test_before_the_first_fleet_filter_answers_error(
    open_extender, discovery, allocator, build
) -> None:
    discovery.available = False
    async with open_extender() as extender:
        reply = await post_filter(extender, build.filter_args(build.pod(), NODES))
    assert "not synced yet" in reply["Error"]
    assert allocator.requests == []


async def test_a_server_added_later_is_dropped_once_discovery_publishes_it(
    extender, discovery, allocator, build, make
) -> None:
    fleet = discovery.fleet.value
    discovery.publish_fleet(make.fleet(*fleet.servers, make.server("cpu-node-1"), revision=7))
    with anyio.fail_after(5):
        await discovery.fleet.wait_newer(fleet.revision, 5)
        while "cpu-node-1" not in await _servers(extender, build):
            await anyio.sleep(0.01)
    assert allocator.requests[-1].candidate_nodes == ("gpu-node-1",)


async def _servers(extender, build) -> set[str]:
    reply = await post_filter(extender, build.filter_args(build.pod(), NODES))
    return set(reply["FailedAndUnresolvableNodes"] or {})


async def test_outcomes_are_counted_by_reason(extender, build) -> None:
    await post_filter(extender, build.filter_args(build.pod(), NODES))
    await post_filter(extender, build.filter_args(build.pod(build.container()), NODES))
    assert (
        extender.metric("rgpu_extender_outcomes_total", {"verb": "filter", "outcome": "fit"}) == 1
    )
    labels = {"verb": "filter", "outcome": "no_request"}
    assert extender.metric("rgpu_extender_outcomes_total", labels) == 1
    count = extender.metric(
        "rgpu_extender_verb_duration_seconds_count", {"verb": "filter", "outcome": "fit"}
    )
    assert count == 1


async def test_no_fit_is_explained_once_on_the_pod_as_a_warning_event(
    extender, allocator, sim, build, make
) -> None:
    allocator.no_fit = make.no_fit()
    for _ in range(3):
        await post_filter(extender, build.filter_args(build.pod(), NODES))
    with anyio.fail_after(5):
        while not (events := sim.store.list("events", namespace="ml-team")):
            await anyio.sleep(0.01)
    await anyio.sleep(0.1)
    (event,) = sim.store.list("events", namespace="ml-team")
    assert event["reason"] == "RemoteGPUUnavailable"
    assert event["type"] == "Warning"
    assert event["message"] == "2/4 CardInsufficientMemory, 2/4 ExclusiveDeviceAllocateConflict"
    assert event["involvedObject"]["name"] == "trainer-0"
    assert events[0]["source"]["component"] == "rgpu-scheduler"


async def test_a_token_that_cannot_be_read_answers_the_scheduler_with_error_not_a_503(
    open_extender, build, tmp_path
) -> None:
    missing = tmp_path / "no-tokens"
    env = {"RGPU_AUTH": "tokenreview", "RGPU_TOKEN_DIR": str(missing)}
    async with open_extender(**env) as extender:
        answer = await extender.client.post(
            "/filter", json=build.filter_args(build.pod(build.container(count="1")), ["gpu-node-1"])
        )
    assert answer.status_code == 200
    assert "cannot authenticate" in answer.json()["Error"]
