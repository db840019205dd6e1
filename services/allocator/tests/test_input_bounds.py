"""Input the allocator's routes refuse before parsing or looking anything up (docs/design.md §10):
oversized bodies (413 while they stream), uids and names past Kubernetes' own limits (400
naming the field), revisions of thousands of digits (400). Never a 5xx; still ready after."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rgpu_runtime.settings import DEFAULT_MAX_BODY_BYTES as MAX_BODY_BYTES

pytestmark = pytest.mark.anyio

LONG_UID = "u" * 129
HUGE_UID = "u" * 60_000  # httpx refuses URLs past 64 KiB


@pytest.fixture
async def client(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        yield client
        assert (await client.get("/readyz")).status_code == 200


@pytest.mark.parametrize("uid", [LONG_UID, HUGE_UID], ids=["129", "60000"])
@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("DELETE", "", None),
        ("POST", "/commit", {"node": "client-1"}),
    ],
    ids=["get", "release", "commit"],
)
async def test_path_uid_longer_than_kubernetes_allows_is_refused_naming_uid(
    client, uid, method, suffix, body
):
    got = await client.request(method, f"/v1/allocations/{uid}{suffix}", json=body)
    assert got.status_code == 400, got.text
    assert got.json()["code"] == "too_long"
    assert got.json()["message"].startswith(f"uid is {len(uid)} characters")


async def test_path_uid_at_the_limit_is_looked_up(client):
    got = await client.get(f"/v1/allocations/{'u' * 128}")
    assert got.status_code == 404
    assert got.json()["code"] == "claim_not_found"


@pytest.mark.parametrize(
    ("field", "pod"),
    [
        ("pod.uid", {"uid": LONG_UID, "namespace": "ml", "name": "p"}),
        ("pod.name", {"uid": "u-1", "namespace": "ml", "name": "p" * 254}),
        ("pod.namespace", {"uid": "u-1", "namespace": "n" * 64, "name": "p"}),
    ],
)
async def test_allocation_for_a_pod_past_kubernetes_limits_is_refused_naming_the_field(
    build, kit, client, field, pod
):
    body = kit.ask(build.pod(), build.container())
    body["pod"] = pod
    got = await client.post("/v1/allocations", json=body)
    assert got.status_code == 400, got.text
    assert got.json()["message"].startswith(f"{field} is ")


async def test_allocation_with_a_candidate_node_name_too_long_is_refused(build, kit, client):
    body = kit.ask(build.pod(), build.container(), candidates=["client-1", "n" * 254])
    got = await client.post("/v1/allocations", json=body)
    assert got.status_code == 400, got.text
    assert got.json()["message"].startswith("candidateNodes[1] is 254 characters")


async def test_commit_to_a_node_name_too_long_is_refused_naming_node(client):
    got = await client.post("/v1/allocations/u-1/commit", json={"node": "n" * 254})
    assert got.status_code == 400, got.text
    assert got.json()["message"].startswith("node is 254 characters")


@pytest.mark.parametrize("path", ["/v1/allocations", "/v1/allocations/u-1/commit"])
async def test_body_over_the_limit_is_refused_with_413(client, path):
    got = await client.post(path, content=b" " * (MAX_BODY_BYTES + 1))
    assert got.status_code == 413, got.text
    assert got.json()["code"] == "payload_too_large"


async def test_streamed_body_over_the_limit_is_refused_while_it_arrives(client):
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        # No Content-Length: only counting what arrives can stop this body.
        for _ in range(64):
            sent.append(1)
            yield b" " * 65536

    got = await client.post("/v1/allocations", content=chunks())
    assert got.status_code == 413, got.text
    assert len(sent) < 64


async def test_since_of_thousands_of_digits_is_refused_naming_since(client):
    got = await client.get("/v1/claims", params={"since": "9" * 5000})
    assert got.status_code == 400, got.text
    assert "since=" in got.json()["message"]


async def test_commit_body_over_a_few_kib_is_refused_with_413(client):
    got = await client.post("/v1/allocations/u-1/commit", content=b" " * 5000)
    assert got.status_code == 413, got.text
    assert "limit of 4096 bytes" in got.json()["message"]


async def test_booking_body_is_held_to_the_max_body_bytes_setting(build, kit, sim):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    env = {"RGPU_MAX_BODY_BYTES": "2048"}
    async with kit.running_allocator(sim.url, discovery, **env) as client:
        body = kit.ask(build.pod(), build.container(), candidates=[f"n-{i}" for i in range(500)])
        got = await client.post("/v1/allocations", json=body)
    assert got.status_code == 413, got.text
    assert "2048 bytes" in got.json()["message"]
