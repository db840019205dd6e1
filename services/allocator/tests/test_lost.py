"""A held server lost under its holder, at the service boundary: the real app on kubesim's
apiserver over HTTP, the fleet from a fake discovery, Events, ``pods/status`` and evictions as
kubesim stores them."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

import rgpu_testkit as testkit
from rgpu_allocator import create_app
from rgpu_allocator.lost import REASON_BACK, REASON_EVICTED, REASON_LOST
from rgpu_contracts import READINESS_GATE, PodRef, PodUID, Server
from rgpu_kubesim import ApiError

pytestmark = pytest.mark.anyio

GRACE = "0.4"


def make_pod(cluster, name: str, *, gated: bool = True, labels: Mapping[str, str] | None = None):
    spec: dict[str, object] = {"terminationGracePeriodSeconds": 1}
    if gated:
        spec["readinessGates"] = [{"conditionType": READINESS_GATE}]
    manifest = testkit.pod_manifest(
        name=name, namespace="ml", scheduler="rgpu-scheduler", labels=labels, spec=spec
    )
    made = cluster.sim.store.create("pods", manifest)
    return PodRef(uid=PodUID(made["metadata"]["uid"]), namespace="ml", name=name)


async def hold(client: httpx.AsyncClient, cluster, pod: PodRef, kit) -> str:
    booked = await client.post("/v1/allocations", json=kit.ask(pod))
    assert booked.status_code == 200, booked.text
    commit = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "client-1"})
    assert commit.status_code == 200, commit.text
    cluster.bind(pod)
    return str(booked.json()["server"])


def gate(cluster, pod: PodRef) -> str | None:
    got = cluster.sim.store.get("pods", pod.name, namespace=pod.namespace)
    for condition in got.get("status", {}).get("conditions") or ():
        if condition["type"] == READINESS_GATE:
            return str(condition["status"])
    return None


def events(cluster, pod: PodRef, reason: str) -> list[dict[str, object]]:
    return [
        e
        for e in cluster.sim.store.list("events", namespace=pod.namespace)
        if e["reason"] == reason and e["involvedObject"]["name"] == pod.name
    ]


def gone_or_terminating(cluster, pod: PodRef) -> bool:
    try:
        got = cluster.sim.store.get("pods", pod.name, namespace=pod.namespace)
    except ApiError:
        return True
    return bool(got["metadata"].get("deletionTimestamp"))


def sample(text: str, line: str) -> float | None:
    found = [row for row in text.splitlines() if row.startswith(line + " ")]
    return float(found[0].split()[-1]) if found else None


def republish(discovery, server: Server, **change: object) -> None:
    discovery.publish(dataclasses.replace(server, **change))


@contextlib.asynccontextmanager
async def allocator(kit, sim, discovery, **env: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = kit.settings_for(sim.url, **{"RGPU_SERVER_LOST_GRACE_SECONDS": GRACE, **env})
    app = create_app(
        settings, discovery_transport=discovery.transport, registry=CollectorRegistry()
    )
    async with (
        kit.caller(sim.url) as auth,
        LifespanManager(app, startup_timeout=20, shutdown_timeout=20) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://allocator", auth=auth
        ) as client,
    ):
        await kit.wait_fleet(client)
        yield client


async def test_a_gated_holder_of_a_healthy_server_is_ready_once_it_runs(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    pod = make_pod(cluster, "trainer")
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, pod, kit)
        await kit.wait_for(lambda: gate(cluster, pod) == "True", what="the gate set True")


@pytest.mark.parametrize("loss", [{"reachable": False}, {"ready": False}])
async def test_a_holder_is_told_after_the_grace_and_ready_again_when_the_server_returns(
    build, kit, sim, cluster, loss
):
    server = build.server("gpu-a")
    discovery = kit.FakeDiscovery(build.fleet(server))
    pod = make_pod(cluster, "trainer")
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, pod, kit)
        await kit.wait_for(lambda: gate(cluster, pod) == "True", what="the gate set True")
        republish(discovery, server, **loss)
        await kit.wait_for(lambda: gate(cluster, pod) == "False", what="the gate set False")
        await kit.wait_for(lambda: events(cluster, pod, REASON_LOST), what="the lost Event")
        told = events(cluster, pod, REASON_LOST)
        lost = sample((await client.get("/metrics")).text, 'rgpu_holders_lost{server="gpu-a"}')
        republish(discovery, server)
        await kit.wait_for(lambda: gate(cluster, pod) == "True", what="the gate True again")
        await kit.wait_for(lambda: events(cluster, pod, REASON_BACK), what="the back Event")
        after = sample((await client.get("/metrics")).text, 'rgpu_holders_lost{server="gpu-a"}')
    assert len(told) == 1 and told[0]["type"] == "Warning"
    assert "gpu-a" in str(told[0]["message"])
    assert (lost, after) == (1.0, None)
    assert not gone_or_terminating(cluster, pod)


async def test_a_held_server_gone_from_the_fleet_is_lost_and_found_again_when_it_returns(
    build, kit, sim, cluster
):
    held, other = build.server("gpu-a"), build.server("gpu-b")
    discovery = kit.FakeDiscovery(build.fleet(held, other))
    pod = make_pod(cluster, "trainer")
    async with allocator(kit, sim, discovery) as client:
        assert await hold(client, cluster, pod, kit) == "gpu-a"
        await kit.wait_for(lambda: gate(cluster, pod) == "True", what="the gate set True")
        discovery.publish(other)  # gpu-a's Node deleted
        await kit.wait_for(lambda: events(cluster, pod, REASON_LOST), what="the lost Event")
        await kit.wait_for(lambda: gate(cluster, pod) == "False", what="the gate set False")
        lost = sample((await client.get("/metrics")).text, 'rgpu_holders_lost{server="gpu-a"}')
        discovery.publish(held, other)
        await kit.wait_for(lambda: events(cluster, pod, REASON_BACK), what="the back Event")
        await kit.wait_for(lambda: gate(cluster, pod) == "True", what="the gate True again")
    [told] = events(cluster, pod, REASON_LOST)
    assert "no longer in the fleet (its Node was deleted" in str(told["message"])
    assert "gpu-a (no endpoint)" in str(told["message"])
    assert lost == 1.0


async def test_a_loss_shorter_than_the_grace_tells_nobody(build, kit, sim, cluster):
    server = build.server("gpu-a")
    discovery = kit.FakeDiscovery(build.fleet(server))
    pod = make_pod(cluster, "trainer")
    async with allocator(kit, sim, discovery, RGPU_SERVER_LOST_GRACE_SECONDS="30") as client:
        await hold(client, cluster, pod, kit)
        await kit.wait_for(lambda: gate(cluster, pod) == "True", what="the gate set True")
        republish(discovery, server, reachable=False)
        await kit.wait_for(lambda: saw_revision(client, 2), what="the allocator saw the loss")
        republish(discovery, server)
        await kit.wait_for(lambda: saw_revision(client, 3), what="the allocator saw it back")
    assert gate(cluster, pod) == "True"
    assert events(cluster, pod, REASON_LOST) == []


async def saw_revision(client: httpx.AsyncClient, revision: int) -> bool:
    status = (await client.get("/v1/status")).json()
    return bool(status["fleetRevision"] >= revision)


async def test_an_ungated_holder_gets_the_event_and_no_condition(build, kit, sim, cluster):
    server = build.server("gpu-a")
    discovery = kit.FakeDiscovery(build.fleet(server))
    pod = make_pod(cluster, "trainer", gated=False)
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, pod, kit)
        republish(discovery, server, ready=False)
        await kit.wait_for(lambda: events(cluster, pod, REASON_LOST), what="the lost Event")
    assert gate(cluster, pod) is None


async def test_keep_never_evicts_and_evict_evicts_the_holder(build, kit, sim, cluster):
    server = build.server("gpu-a")
    discovery = kit.FakeDiscovery(build.fleet(server, build.server("gpu-b")))
    kept, evicted = make_pod(cluster, "kept"), make_pod(cluster, "evicted")
    async with allocator(kit, sim, discovery, RGPU_ON_SERVER_LOST="evict") as client:
        assert await hold(client, cluster, evicted, kit) == "gpu-a"
        assert await hold(client, cluster, kept, kit) == "gpu-b"
        republish_both = dataclasses.replace(server, reachable=False)
        discovery.publish(republish_both, build.server("gpu-b"))
        await kit.wait_for(lambda: gone_or_terminating(cluster, evicted), what="the eviction")
        await kit.wait_for(lambda: events(cluster, evicted, REASON_EVICTED), what="its Event")
    assert not gone_or_terminating(cluster, kept)


async def test_a_budget_that_forbids_the_eviction_is_retried_until_it_allows(
    build, kit, sim, cluster
):
    server = build.server("gpu-a")
    discovery = kit.FakeDiscovery(build.fleet(server))
    pod = make_pod(cluster, "guarded", gated=False, labels={"app": "guarded"})
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": "ml"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    cluster.sim.store.create("poddisruptionbudgets", budget)
    async with allocator(kit, sim, discovery, RGPU_ON_SERVER_LOST="evict") as client:
        await hold(client, cluster, pod, kit)
        republish(discovery, server, reachable=False)
        line = 'rgpu_allocator_lost_server_evictions_total{outcome="refused"}'

        async def refused() -> bool:
            return (sample((await client.get("/metrics")).text, line) or 0) >= 1

        await kit.wait_for(refused, what="a refused eviction")
        assert not gone_or_terminating(cluster, pod)
        cluster.sim.store.delete("poddisruptionbudgets", "guarded", namespace="ml")
        await kit.wait_for(lambda: gone_or_terminating(cluster, pod), what="the eviction")
