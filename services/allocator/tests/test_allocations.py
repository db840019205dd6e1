"""The allocation API end to end: real app, kubesim over HTTP, fake discovery transport."""

from __future__ import annotations

import anyio
import pytest

from rgpu_allocator.annotations import ANNOTATION_VISIBLE_DEVICES
from rgpu_allocator.claims import MANAGED_BY_LABEL
from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_ENDPOINT,
    ANNOTATION_TO_ALLOCATE,
    ContainerKind,
    ContainerRequest,
)

pytestmark = pytest.mark.anyio


def app_container(name: str = "main", count: int = 1, memory: int = 0, kind: str = "app"):
    return ContainerRequest(name=name, kind=ContainerKind(kind), count=count, memory_mib=memory)


async def test_allocation_books_a_server_in_a_lease(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=2)))
    pod = cluster.pod("trainer")
    async with kit.running_allocator(sim.url, discovery) as client:
        answer = await client.post("/v1/allocations", json=kit.ask(pod))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["server"] == "gpu-a"
    assert body["state"] == "booked"
    assert body["endpoint"] == "10.0.0.5:14833"
    assert body["expiresAt"] == pytest.approx(body["bookedAt"] + 30)
    lease = cluster.lease("gpu-a")
    assert lease["metadata"]["labels"][MANAGED_BY_LABEL] == "rgpu"
    assert lease["spec"]["holderIdentity"] == pod.key
    assert [c["pod"]["uid"] for c in cluster.claims("gpu-a")] == [pod.uid]


async def test_same_pod_gets_the_same_server_back_even_after_a_restart(build, kit, sim, cluster):
    servers = [build.server(f"gpu-{i}", cards=2) for i in range(5)]
    discovery = kit.FakeDiscovery(build.fleet(*servers))
    pod = cluster.pod("trainer")
    async with kit.running_allocator(sim.url, discovery) as client:
        first = (await client.post("/v1/allocations", json=kit.ask(pod))).json()
        again = (await client.post("/v1/allocations", json=kit.ask(pod))).json()
    async with kit.running_allocator(sim.url, discovery) as client:
        restarted = (await client.post("/v1/allocations", json=kit.ask(pod))).json()
    assert first["server"] == again["server"] == restarted["server"]
    assert first["bookedAt"] == restarted["bookedAt"]
    assert sum(len(v) for v in cluster.holders().values()) == 1


async def test_dry_run_answers_without_booking(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    pod = cluster.pod("trainer")
    async with kit.running_allocator(sim.url, discovery) as client:
        answer = await client.post("/v1/allocations", json=kit.ask(pod, dry_run=True))
    assert answer.status_code == 200
    assert answer.json()["server"] == "gpu-a"
    assert cluster.lease("gpu-a") is None


@pytest.mark.parametrize("granularity", ["server", "card"])
async def test_no_fit_is_409_with_hami_reasons_and_a_dry_run_explains_server_by_server(
    build, kit, sim, cluster, granularity
):
    fleet = build.fleet(
        build.server("gpu-a", cards=2, ready=False),
        build.server("gpu-b", cards=2, memory=[20000, 80000]),
    )
    discovery = kit.FakeDiscovery(fleet)
    pod = cluster.pod("trainer")
    big = app_container(count=2, memory=40000)
    async with kit.running_allocator(sim.url, discovery, RGPU_GRANULARITY=granularity) as client:
        answer = await client.post("/v1/allocations", json=kit.ask(pod, big))
        explained = await client.post("/v1/allocations", json=kit.ask(pod, big, dry_run=True))
    message = "1/4 CardInsufficientMemory, 1/4 NodeInsufficientDevice, 2/4 ServerNotReady"
    assert answer.status_code == explained.status_code == 409
    body = answer.json()
    assert body["message"] == explained.json()["message"] == message
    assert body["total"] == 4
    # kube-scheduler shows only the message: the server-by-server detail is a dry run's.
    assert body["servers"] == []
    servers = explained.json()["servers"]
    assert [s["server"] for s in servers] == ["gpu-a", "gpu-b"]
    assert "not Ready" in servers[0]["detail"]


async def test_empty_fleet_is_refused_with_no_servers(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet())
    async with kit.running_allocator(sim.url, discovery) as client:
        answer = await client.post("/v1/allocations", json=kit.ask(cluster.pod("p")))
    assert answer.status_code == 409
    assert answer.json()["message"] == "0/0 NoServers"


async def test_unknown_fleet_is_a_retryable_503(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    discovery.available = False
    async with kit.running_allocator(sim.url, discovery, wait=False) as client:
        answer = await client.post("/v1/allocations", json=kit.ask(cluster.pod("p")))
        assert answer.status_code == 503
        assert answer.json()["retryable"] is True
        assert answer.json()["code"] == "fleet_unknown"
        discovery.available = True
        await kit.wait_fleet(client)
        again = await client.post("/v1/allocations", json=kit.ask(cluster.pod("q")))
    assert again.status_code == 200


async def test_apiserver_away_is_a_retryable_503(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        sim.faults.set_error(verb="create", resource="leases", rate=1.0, code=503)
        answer = await client.post("/v1/allocations", json=kit.ask(cluster.pod("p")))
    assert answer.status_code == 503
    assert answer.json()["retryable"] is True


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {
                "pod": {"uid": "", "namespace": "a", "name": "b"},
                "containers": [{"name": "m", "kind": "app", "count": 1}],
            },
            "pod.uid",
        ),
        (
            {
                "pod": {"uid": "u", "namespace": "a", "name": "b"},
                "containers": [{"name": "m", "kind": "app", "count": -1}],
            },
            "containers[0].count",
        ),
        ({"pod": {"uid": "u", "namespace": "a", "name": "b"}, "containers": []}, "containers"),
    ],
)
async def test_bad_request_names_the_field(build, kit, sim, body, field):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        answer = await client.post("/v1/allocations", json=body)
    assert answer.status_code == 400
    assert field in answer.json()["message"]


async def test_commit_returns_the_binding_annotations_in_pod_order(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=2)))
    pod = cluster.pod("trainer", containers=("plain", "main"), init=("setup",))
    containers = (
        app_container("setup", 1, kind="init"),
        app_container("plain", 0),
        app_container("main", 1),
    )
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(pod, *containers))
        answer = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "c1"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["state"] == "committed"
    cards = "".join(f"gpu-a/{build.uuid('gpu-a', i)},RemoteGPU,40000,100:" for i in range(2))
    devices = f"{cards};;{cards};"
    assert body["annotations"] == {
        ANNOTATION_TO_ALLOCATE: devices,
        ANNOTATION_ALLOCATED: devices,
        ANNOTATION_ENDPOINT: "10.0.0.5:14833",
    }
    claim = cluster.claims("gpu-a")[0]
    assert claim["state"] == "committed"
    assert claim["node"] == "c1"


async def test_card_mode_shares_a_server_with_disjoint_visible_devices(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=4)))
    first, second = cluster.pod("one"), cluster.pod("two")
    async with kit.running_allocator(sim.url, discovery, RGPU_GRANULARITY="card") as client:
        a = (
            await client.post("/v1/allocations", json=kit.ask(first, app_container(count=2)))
        ).json()
        b = (
            await client.post("/v1/allocations", json=kit.ask(second, app_container(count=2)))
        ).json()
        third = await client.post("/v1/allocations", json=kit.ask(cluster.pod("three")))
        commit = await client.post(f"/v1/allocations/{first.uid}/commit", json={"node": "c1"})
    assert a["server"] == b["server"] == "gpu-a"
    assert not set(a["cards"]) & set(b["cards"])
    assert third.status_code == 409
    assert (
        third.json()["message"] == "4/4 ExclusiveDeviceAllocateConflict, 1/4 NodeInsufficientDevice"
    )
    visible = commit.json()["annotations"][ANNOTATION_VISIBLE_DEVICES]
    assert visible == ",".join(c.split("/")[1] for c in a["cards"])
    assert cluster.lease("gpu-a")["spec"].get("holderIdentity") == "2 pods"


async def test_commit_of_an_unknown_uid_is_404_and_a_missing_node_is_400(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        missing = await client.post("/v1/allocations/nope/commit", json={"node": "c1"})
        bad = await client.post("/v1/allocations/nope/commit", json={"nodes": "c1"})
    assert missing.status_code == 404
    assert missing.json()["code"] == "claim_not_found"
    assert bad.status_code == 400
    assert "node: is required" in bad.json()["message"]


async def test_commit_after_the_booking_expired_is_409(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    pod = cluster.pod("slow")
    async with kit.running_allocator(sim.url, discovery, RGPU_BOOKING_TTL_SECONDS="0.3") as client:
        await client.post("/v1/allocations", json=kit.ask(pod))
        await anyio.sleep(0.4)
        answer = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "c1"})
    assert answer.status_code in (404, 409)
    assert answer.json()["code"] in ("booking_expired", "claim_not_found")


async def test_release_is_idempotent_and_frees_the_server(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    holder, waiter = cluster.pod("holder"), cluster.pod("waiter")
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(holder))
        refused = await client.post("/v1/allocations", json=kit.ask(waiter))
        gone = [await client.delete(f"/v1/allocations/{holder.uid}") for _ in range(2)]
        got = await client.post("/v1/allocations", json=kit.ask(waiter))
    assert refused.status_code == 409
    assert refused.json()["message"] == "4/4 ExclusiveDeviceAllocateConflict"
    assert [r.status_code for r in gone] == [204, 204]
    assert got.status_code == 200
    assert cluster.holders() == {"gpu-a": ["waiter"]}


async def test_get_allocation_reports_the_claim_or_404(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    pod = cluster.pod("trainer")
    async with kit.running_allocator(sim.url, discovery) as client:
        before = await client.get(f"/v1/allocations/{pod.uid}")
        await client.post("/v1/allocations", json=kit.ask(pod))
        after = await client.get(f"/v1/allocations/{pod.uid}")
    assert before.status_code == 404
    assert after.status_code == 200
    assert after.json()["server"] == "gpu-a"


async def test_claims_long_poll_returns_when_a_claim_changes(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    pod = cluster.pod("trainer")
    async with kit.running_allocator(sim.url, discovery) as client:
        start = (await client.get("/v1/claims")).json()
        results = {}

        async def poll() -> None:
            params = {"since": start["revision"], "wait": 10}
            results["answer"] = (await client.get("/v1/claims", params=params)).json()

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await anyio.sleep(0.05)
            await client.post("/v1/allocations", json=kit.ask(pod))
        bad = await client.get("/v1/claims", params={"wait": 5})
    assert start["claims"] == []
    assert results["answer"]["revision"] != start["revision"]
    assert [c["pod"]["uid"] for c in results["answer"]["claims"]] == [pod.uid]
    assert bad.status_code == 400
    assert "since" in bad.json()["message"]


async def test_status_and_metrics_report_state(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(cluster.pod("p")))
        await client.post("/v1/allocations", json=kit.ask(cluster.pod("q")))
        status = (await client.get("/v1/status")).json()
        metrics = (await client.get("/metrics")).text
    assert status["claims"] == 1
    assert status["fleetRevision"] == 1
    assert status["refusedWaiting"] == 1
    assert 'rgpu_allocator_claims{state="booked"} 1.0' in metrics
    assert 'rgpu_allocator_decisions_total{outcome="allocated",reason=""} 1.0' in metrics
    assert (
        'rgpu_allocator_decisions_total{outcome="refused",reason="ExclusiveDeviceAllocateConflict"}'
        in metrics
    )
    assert "rgpu_allocator_decision_seconds_count" in metrics


async def test_missing_claim_namespace_is_a_503_naming_the_setting(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery, RGPU_NAMESPACE="nowhere") as client:
        answer = await client.post("/v1/allocations", json=kit.ask(cluster.pod("p")))
    assert answer.status_code == 503
    assert answer.json()["code"] == "namespace_missing"
    assert "RGPU_NAMESPACE" in answer.json()["message"]


async def test_a_client_in_zone_a_rack_r1_is_booked_zone_a_rack_r2_not_zone_b_rack_r1(
    build, kit, sim, cluster
):
    rack, zone = "topology.rgpu.io/rack", "topology.kubernetes.io/zone"
    discovery = kit.FakeDiscovery(
        build.fleet(
            # The smaller server would win on best fit alone: locality must decide first.
            build.server("b-r1", cards=1, labels={rack: "r1", zone: "b"}),
            build.server("a-r2", cards=4, labels={rack: "r2", zone: "a"}),
        ),
        build.topology({"client-1": {rack: "r1", zone: "a"}}),
    )
    pod = cluster.pod("trainer")
    async with kit.running_allocator(sim.url, discovery) as client:

        async def near_once_topology_known() -> bool:
            ask = kit.ask(pod, candidates=["client-1"], dry_run=True)
            return (await client.post("/v1/allocations", json=ask)).json()["server"] == "a-r2"

        await kit.wait_for(near_once_topology_known, timeout=5.0)
        answer = await client.post("/v1/allocations", json=kit.ask(pod, candidates=["client-1"]))
    assert answer.status_code == 200, answer.text
    assert answer.json()["server"] == "a-r2"
    assert [c["pod"]["uid"] for c in cluster.claims("a-r2")] == [pod.uid]
