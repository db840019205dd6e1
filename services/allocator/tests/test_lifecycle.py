"""Claims over time: pods finishing or vanishing, bookings expiring, Leases changed behind the
allocator's back, stale watches, wake-up nudges, repair from annotations, racing replicas."""

from __future__ import annotations

import anyio
import orjson
import pytest
from prometheus_client import CollectorRegistry

from rgpu_allocator.annotations import ANNOTATION_RETRY_AT
from rgpu_allocator.claims import encode_lease
from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    CardId,
    Claim,
    ClaimState,
    ContainerAssignment,
    PodRef,
    PodUID,
    ServerName,
)

pytestmark = pytest.mark.anyio

ONE_CARD = {"nvidia.com/remote-gpu": "1"}


def allocated(build, server: str, *indexes: int) -> str:
    cards = "".join(f"{server}/{build.uuid(server, i)},RemoteGPU,40000,100:" for i in indexes)
    return f"{cards};"


async def test_pod_deletion_frees_its_server(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    holder = cluster.pod("holder")
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(holder))
        cluster.bind(holder)
        cluster.delete(holder)

        async def freed() -> bool:
            return cluster.holders().get("gpu-a") == []

        await kit.wait_for(freed)
        got = await client.post("/v1/allocations", json=kit.ask(cluster.pod("next")))
    assert got.status_code == 200


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
async def test_pod_completion_frees_its_server(build, kit, sim, cluster, phase):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    holder = cluster.pod("holder")
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(holder))
        await client.post(f"/v1/allocations/{holder.uid}/commit", json={"node": "client-1"})
        cluster.bind(holder)

        async def bound() -> bool:
            return [c["state"] for c in cluster.claims("gpu-a")] == ["bound"]

        await kit.wait_for(bound)
        cluster.phase(holder, phase)

        async def freed() -> bool:
            return cluster.holders().get("gpu-a") == []

        await kit.wait_for(freed)


async def test_unbound_booking_expires_and_the_sweep_removes_it(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    abandoned, waiter = cluster.pod("abandoned"), cluster.pod("waiter")
    async with kit.running_allocator(sim.url, discovery, RGPU_BOOKING_TTL_SECONDS="0.6") as client:
        await client.post("/v1/allocations", json=kit.ask(abandoned))
        refused = await client.post("/v1/allocations", json=kit.ask(waiter))

        async def swept() -> bool:
            return cluster.holders().get("gpu-a") == []

        await kit.wait_for(swept)
        got = await client.post("/v1/allocations", json=kit.ask(waiter))
        metrics = (await client.get("/metrics")).text
    assert refused.status_code == 409
    assert got.status_code == 200
    assert 'rgpu_allocator_sweep_removals_total{reason="expired"} 1.0' in metrics


async def test_bound_pod_keeps_its_claim_past_the_ttl(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    holder = cluster.pod("holder")
    async with kit.running_allocator(sim.url, discovery, RGPU_BOOKING_TTL_SECONDS="0.3") as client:
        await client.post("/v1/allocations", json=kit.ask(holder))
        await client.post(f"/v1/allocations/{holder.uid}/commit", json={"node": "client-1"})
        cluster.bind(holder)
        await anyio.sleep(0.8)
        again = await client.post("/v1/allocations", json=kit.ask(cluster.pod("other")))
    assert again.status_code == 409
    assert cluster.holders() == {"gpu-a": ["holder"]}


def intruder_claim(build, server: str) -> Claim:
    cards = (CardId(f"{server}/{build.uuid(server, 0)}"),)
    return Claim(
        pod=PodRef(uid=PodUID("intruder-uid"), namespace="ml", name="intruder"),
        server=ServerName(server),
        cards=cards,
        containers=(ContainerAssignment(name="main", cards=cards),),
        state=ClaimState.BOOKED,
        booked_at=9e12,  # far in the future: valid whatever the TTL
    )


async def test_lease_changed_behind_the_allocators_back_is_decided_again(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    first, second = cluster.pod("first"), cluster.pod("second")
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(first))
        await client.delete(f"/v1/allocations/{first.uid}")
        # Freeze the allocator's view of Leases, then let "someone else" take gpu-a.
        sim.faults.set_error(verb="watch", resource="leases", rate=1.0, code=500)
        sim.faults.set_error(verb="list", resource="leases", rate=1.0, code=500)
        sim.faults.cut_watches()
        await anyio.sleep(0.1)
        lease = sim.store.get("leases", "rgpu-gpu-a", namespace="rgpu-system")
        body = encode_lease(
            server="gpu-a",
            namespace="rgpu-system",
            claims=[intruder_claim(build, "gpu-a")],
            resource_version=lease["metadata"]["resourceVersion"],
        )
        sim.store.replace("leases", body, namespace="rgpu-system")
        got = await client.post("/v1/allocations", json=kit.ask(second))
        metrics = (await client.get("/metrics")).text
        sim.faults.clear()
    assert got.status_code == 200, got.text
    assert got.json()["server"] == "gpu-b"
    assert cluster.holders() == {"gpu-a": ["intruder"], "gpu-b": ["second"]}
    assert 'rgpu_allocator_cas_conflicts_total{operation="book"} 1.0' in metrics


async def test_deleted_holder_frees_the_server_before_the_watch_says_so(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    holder, waiter = cluster.pod("holder"), cluster.pod("waiter")
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(holder))
        await client.post(f"/v1/allocations/{holder.uid}/commit", json={"node": "client-1"})
        cluster.bind(holder)
        assert (await client.post("/v1/allocations", json=kit.ask(waiter))).status_code == 409
        # The allocator's pod watch is cut and cannot come back: it never sees the deletion.
        for verb in ("watch", "list"):
            sim.faults.set_error(verb=verb, resource="pods", rate=1.0, code=500)
        sim.faults.cut_watches()
        # Well inside the Lease re-read interval: the holder check must not wait for it.
        await anyio.sleep(0.1)
        cluster.delete(holder)
        got = await client.post("/v1/allocations", json=kit.ask(waiter))
        sim.faults.clear()
    assert got.status_code == 200, got.text
    assert cluster.holders() == {"gpu-a": ["waiter"]}


async def test_a_refusal_rereads_first_the_holders_asked_to_stop(build, kit, sim, cluster):
    # Six held servers; the fresh reads of one refusal reach four, best placed first, so the
    # holder that ended unseen (on the last server) is found only if it is looked at first.
    names = [f"gpu-{c}" for c in "abcdef"]
    discovery = kit.FakeDiscovery(build.fleet(*(build.server(n) for n in names)))
    holders = [cluster.pod(f"holder-{n}") for n in names]
    waiter = cluster.pod("waiter")
    async with kit.running_allocator(sim.url, discovery) as client:
        for holder in holders:
            await client.post("/v1/allocations", json=kit.ask(holder))
            await client.post(f"/v1/allocations/{holder.uid}/commit", json={"node": "client-1"})
            cluster.bind(holder)
        leaving = next(h for h in holders if cluster.holders()["gpu-f"] == [h.name])
        sim.store.delete("pods", leaving.name, namespace="ml")  # graceful: it keeps running
        await anyio.sleep(0.3)  # the allocator's watch sees the deletion requested
        for verb in ("watch", "list"):
            sim.faults.set_error(verb=verb, resource="pods", rate=1.0, code=500)
        sim.faults.cut_watches()
        await anyio.sleep(0.1)
        cluster.delete(leaving)  # it ended; the allocator's watch cannot say so
        got = await client.post("/v1/allocations", json=kit.ask(waiter))
        sim.faults.clear()
    assert got.status_code == 200, got.text
    assert got.json()["server"] == "gpu-f"


async def test_refused_pod_is_nudged_when_a_server_frees_up(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    holder, waiter = cluster.pod("holder"), cluster.pod("waiter")
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(holder))
        assert (await client.post("/v1/allocations", json=kit.ask(waiter))).status_code == 409
        assert ANNOTATION_RETRY_AT not in cluster.annotations(waiter)
        # The holder ran and ended; a pod still pending with no booking would be a waiting pod
        # the leader nudges too.
        await client.post(f"/v1/allocations/{holder.uid}/commit", json={"node": "client-1"})
        cluster.bind(holder, phase="Succeeded")
        await client.delete(f"/v1/allocations/{holder.uid}")

        async def nudged() -> bool:
            return ANNOTATION_RETRY_AT in cluster.annotations(waiter)

        await kit.wait_for(nudged)
    assert ANNOTATION_RETRY_AT not in cluster.annotations(holder)


async def test_refused_pod_is_nudged_when_a_server_is_added(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", ready=False)))
    waiter = cluster.pod("waiter")
    async with kit.running_allocator(sim.url, discovery) as client:
        assert (await client.post("/v1/allocations", json=kit.ask(waiter))).status_code == 409
        discovery.publish(build.server("gpu-a"))

        async def nudged() -> bool:
            return ANNOTATION_RETRY_AT in cluster.annotations(waiter)

        await kit.wait_for(nudged)


async def test_forged_annotation_on_another_schedulers_pod_reserves_nothing(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=1)))
    forger = cluster.pod(
        "forger",
        scheduler="default-scheduler",
        annotations={ANNOTATION_ALLOCATED: allocated(build, "gpu-a", 0)},
    )
    cluster.bind(forger)
    async with kit.running_allocator(sim.url, discovery, RGPU_BOOKING_TTL_SECONDS="0.6") as client:
        await anyio.sleep(0.5)  # a couple of sweeps
        got = await client.post("/v1/allocations", json=kit.ask(cluster.pod("honest")))
    assert got.status_code == 200
    assert cluster.holders() == {"gpu-a": ["honest"]}


async def test_missing_claim_of_a_running_pod_is_repaired(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=2)))
    running = cluster.pod(
        "running",
        annotations={ANNOTATION_ALLOCATED: allocated(build, "gpu-a", 0, 1)},
        limits=ONE_CARD,
    )
    cluster.bind(running)
    async with kit.running_allocator(sim.url, discovery) as client:

        async def repaired() -> bool:
            return cluster.holders().get("gpu-a") == ["running"]

        await kit.wait_for(repaired)
        refused = await client.post("/v1/allocations", json=kit.ask(cluster.pod("other")))
        metrics = (await client.get("/metrics")).text
    claim = cluster.claims("gpu-a")[0]
    assert claim["state"] == "bound"
    assert claim["containers"] == [{"name": "main", "cards": claim["cards"]}]
    assert refused.status_code == 409
    assert 'rgpu_allocator_repairs_total{outcome="repaired"} 1.0' in metrics


async def test_repair_conflict_is_reported_as_an_event_not_resolved(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=1)))
    text = allocated(build, "gpu-a", 0)
    one = cluster.pod("one", annotations={ANNOTATION_ALLOCATED: text}, limits=ONE_CARD)
    two = cluster.pod("two", annotations={ANNOTATION_ALLOCATED: text}, limits=ONE_CARD)
    cluster.bind(one)
    cluster.bind(two)
    async with kit.running_allocator(sim.url, discovery) as client:

        async def reported() -> bool:
            events = sim.store.list("events", namespace="ml")
            return any(e["reason"] == "RemoteGPUClaimConflict" for e in events)

        await kit.wait_for(reported)
        metrics = (await client.get("/metrics")).text
    events = [e for e in sim.store.list("events", namespace="ml") if e["type"] == "Warning"]
    assert len(events) == 1
    assert len(cluster.holders()["gpu-a"]) == 1
    loser = events[0]["involvedObject"]["name"]
    assert loser not in cluster.holders()["gpu-a"]
    assert "rgpu_allocator_repair_conflicts_total 1.0" in metrics


async def test_replicas_racing_on_one_pod_settle_on_one_server(build, kit, sim, cluster):
    servers = [build.server(f"gpu-{i}") for i in range(4)]
    discovery = kit.FakeDiscovery(build.fleet(*servers))
    pods = [cluster.pod(f"raced-{i}") for i in range(6)]
    async with (
        kit.running_allocator(sim.url, discovery, CollectorRegistry()) as a,
        kit.running_allocator(sim.url, discovery, CollectorRegistry()) as b,
    ):
        answers: dict[tuple[str, str], int] = {}

        async def post(client, name: str, pod) -> None:
            reply = await client.post("/v1/allocations", json=kit.ask(pod))
            answers[(name, pod.name)] = reply.status_code

        async with anyio.create_task_group() as tg:
            for pod in pods:
                tg.start_soon(post, a, "a", pod)
                tg.start_soon(post, b, "b", pod)

        async def settled() -> bool:
            held = [n for names in cluster.holders().values() for n in names]
            return len(held) == len(set(held)) and all(
                len(v) <= 1 for v in cluster.holders().values()
            )

        await kit.wait_for(settled)
        commits = {}
        for pod in pods:
            via_a = await a.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "c1"})
            if via_a.status_code == 200:
                via_b = await b.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "c1"})
                commits[pod.name] = (via_a.json()["server"], via_b.json()["server"])
    assert all(len(v) <= 1 for v in cluster.holders().values())
    assert len(commits) == 4
    assert all(x == y for x, y in commits.values())


async def test_unreadable_lease_is_never_overwritten(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    body = encode_lease(server="gpu-a", namespace="rgpu-system", claims=[], resource_version=None)
    body["metadata"]["annotations"]["rgpu.io/claims"] = "{broken"
    sim.store.create("leases", body, namespace="rgpu-system")
    async with kit.running_allocator(sim.url, discovery) as client:
        first = await client.post("/v1/allocations", json=kit.ask(cluster.pod("one")))
        second = await client.post(
            "/v1/allocations", json=kit.ask(cluster.pod("two"), dry_run=True)
        )
    assert first.json()["server"] == "gpu-b"
    assert second.status_code == 409
    gpu_a = next(v for v in second.json()["servers"] if v["server"] == "gpu-a")
    assert "unreadable" in gpu_a["detail"]
    stored = sim.store.get("leases", "rgpu-gpu-a", namespace="rgpu-system")
    assert stored["metadata"]["annotations"]["rgpu.io/claims"] == "{broken"
    assert orjson.loads(cluster.lease("gpu-b")["metadata"]["annotations"]["rgpu.io/claims"])


async def test_finished_holder_frees_a_server_lupine_still_reports_busy(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    holder, waiter = cluster.pod("holder"), cluster.pod("waiter")
    async with kit.running_allocator(sim.url, discovery) as client:
        booked = await client.post("/v1/allocations", json=kit.ask(holder))
        await client.post(f"/v1/allocations/{holder.uid}/commit", json={"node": "client-1"})
        cluster.bind(holder)
        # The holder runs: lupine reports a client on its card.
        discovery.publish(build.server("gpu-a", busy=(0,)))
        await anyio.sleep(0.1)
        refused = await client.post("/v1/allocations", json=kit.ask(waiter))
        # kube-scheduler retries the moment the holder finishes: before the allocator's
        # watch has seen it, and before discovery probed lupine again.
        for verb in ("watch", "list"):
            sim.faults.set_error(verb=verb, resource="pods", rate=1.0, code=500)
        sim.faults.cut_watches()
        await anyio.sleep(0.1)
        cluster.phase(holder, "Succeeded")
        got = await client.post("/v1/allocations", json=kit.ask(waiter))
        sim.faults.clear()
    assert booked.status_code == 200
    assert refused.status_code == 409
    assert refused.json()["message"] == "4/4 ExclusiveDeviceAllocateConflict"
    assert got.status_code == 200, got.text
    assert cluster.holders() == {"gpu-a": ["waiter"]}
