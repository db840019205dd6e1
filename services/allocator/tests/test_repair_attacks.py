"""Forged annotations against repair (docs/design.md#nothing-a-user-wrote-is-trusted).

The attacker creates pods through the apiserver over HTTP, as ``kubectl`` would: a preset
``spec.nodeName`` (so no scheduler ever looks at the pod), rgpu's ``schedulerName``, and a
hand-written ``hami.io/remote-gpu-devices-allocated`` naming a server's cards; then reports the
pod ``Running`` as its kubelet would. Each attack must book nothing, leave an Event and a
metric behind, and leave the server to an honest GPU pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import httpx
import pytest

import rgpu_testkit as testkit
from rgpu_contracts import ANNOTATION_ALLOCATED, PodRef, PodUID

pytestmark = pytest.mark.anyio

REFUSED = "RemoteGPURepairRefused"
REFUSED_METRIC = 'rgpu_allocator_repairs_total{outcome="refused_untrusted"}'
COUNT = "nvidia.com/remote-gpu"
MEMORY = "nvidia.com/remote-gpu-memory"


def devices(build, server: str, *indexes: int, containers: int = 1) -> str:
    """The annotation HAMi's codec writes: every container sees ``indexes`` of ``server``."""
    cards = "".join(f"{server}/{build.uuid(server, i)},RemoteGPU,40000,100:" for i in indexes)
    return f"{cards};" * containers


def spread(build, *cards: tuple[str, int]) -> str:
    """One container's part naming cards of possibly several servers."""
    named = "".join(f"{s}/{build.uuid(s, i)},RemoteGPU,40000,100:" for s, i in cards)
    return f"{named};"


class Attacker:
    """A user with ``create pods`` in namespace ``ml`` and nothing more, over HTTP."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def run_pod(
        self,
        name: str,
        allocated: str,
        *,
        limits: Mapping[str, str] | None = None,
        scheduler: str = "rgpu-scheduler",
        namespace: str = "ml",
    ) -> PodRef:
        """Create a pod already on ``client-1`` carrying ``allocated``, and mark it Running."""
        manifest = testkit.pod_manifest(
            name=name,
            namespace=namespace,
            scheduler=scheduler,
            node="client-1",
            annotations={ANNOTATION_ALLOCATED: allocated},
            containers=[testkit.container_manifest(name="main", limits=limits)],
        )
        made = await self._send("POST", f"/api/v1/namespaces/{namespace}/pods", manifest)
        await self._send(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": {"phase": "Running"}},
            content_type="application/merge-patch+json",
        )
        return PodRef(uid=PodUID(made["metadata"]["uid"]), namespace=namespace, name=name)

    async def _send(
        self, method: str, path: str, body: object, *, content_type: str = "application/json"
    ) -> Any:
        got = await self.http.request(
            method, path, json=body, headers={"Content-Type": content_type}
        )
        assert got.status_code < 300, got.text
        return got.json()


@pytest.fixture
async def attacker(sim):
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as http:
        yield Attacker(http)


def refusals(sim, pod: PodRef) -> list[dict[str, Any]]:
    """The Warning Events that say ``pod``'s repair was refused."""
    return [
        e
        for e in sim.store.list("events", namespace=pod.namespace)
        if e["reason"] == REFUSED and e["involvedObject"]["uid"] == pod.uid
    ]


async def settled(kit, sim, cluster, pods: Iterable[PodRef]) -> None:
    """Wait until the allocator has acted on every forged pod: refused it, or booked for it
    (what the unguarded repair did), so a test fails on the booking, not on a timeout."""
    names = {p.name for p in pods}

    def acted() -> bool:
        held = {n for holders in cluster.holders().values() for n in holders}
        return all(refusals(sim, p) or p.name in held for p in pods)

    await kit.wait_for(acted, what=f"the allocator acted on {sorted(names)}")


def refused_count(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(REFUSED_METRIC):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def asking(count: int = 1, memory: int | None = None) -> dict[str, str]:
    limits = {COUNT: str(count)}
    if memory is not None:
        limits[MEMORY] = str(memory)
    return limits


async def honest_books(kit, client, cluster, server: str, name: str = "honest") -> None:
    got = await client.post("/v1/allocations", json=kit.ask(cluster.pod(name)))
    assert got.status_code == 200, got.text
    assert got.json()["server"] == server


async def test_forged_pods_asking_for_nothing_hold_no_server(build, kit, sim, cluster, attacker):
    servers = ("gpu-a", "gpu-b", "gpu-c")
    discovery = kit.FakeDiscovery(build.fleet(*(build.server(s, cards=2) for s in servers)))
    async with kit.running_allocator(sim.url, discovery) as client:
        forged = [await attacker.run_pod(f"forger-{s}", devices(build, s, 0, 1)) for s in servers]
        await settled(kit, sim, cluster, forged)
        assert cluster.holders() == {}
        await honest_books(kit, client, cluster, "gpu-a")
        metrics = (await client.get("/metrics")).text
    assert all(refusals(sim, p) for p in forged)
    assert "does not ask for nvidia.com/remote-gpu" in refusals(sim, forged[0])[0]["message"]
    assert refused_count(metrics) == 3.0
    assert 'rgpu_allocator_repairs_total{outcome="repaired"} 0.0' in metrics


async def test_forged_annotation_with_more_cards_than_the_pod_asks_for_is_refused(
    build, kit, sim, cluster, attacker
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=4)))
    async with kit.running_allocator(sim.url, discovery, RGPU_GRANULARITY="card") as client:
        greedy = await attacker.run_pod(
            "greedy", devices(build, "gpu-a", 0, 1, 2), limits=asking(1)
        )
        await settled(kit, sim, cluster, [greedy])
        assert cluster.holders() == {}
        body = kit.ask(cluster.pod("honest"), build.container(count=4))
        got = await client.post("/v1/allocations", json=body)
        metrics = (await client.get("/metrics")).text
    assert got.status_code == 200, got.text
    assert "3 cards" in refusals(sim, greedy)[0]["message"]
    assert refused_count(metrics) == 1.0


async def test_forged_annotation_naming_part_of_a_server_is_refused_in_server_granularity(
    build, kit, sim, cluster, attacker
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=4)))
    async with kit.running_allocator(sim.url, discovery) as client:
        partial = await attacker.run_pod("partial", devices(build, "gpu-a", 0), limits=asking(1))
        await settled(kit, sim, cluster, [partial])
        assert cluster.holders() == {}
        await honest_books(kit, client, cluster, "gpu-a")
    assert "every healthy card" in refusals(sim, partial)[0]["message"]


async def test_forged_annotation_beyond_the_pods_memory_ask_is_refused(
    build, kit, sim, cluster, attacker
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=2, memory=40000)))
    async with kit.running_allocator(sim.url, discovery) as client:
        big = await attacker.run_pod(
            "big", devices(build, "gpu-a", 0, 1), limits=asking(1, memory=80000)
        )
        await settled(kit, sim, cluster, [big])
        assert cluster.holders() == {}
        await honest_books(kit, client, cluster, "gpu-a")
    assert "80000" in refusals(sim, big)[0]["message"]


async def test_forged_annotation_naming_two_servers_is_refused(build, kit, sim, cluster, attacker):
    discovery = kit.FakeDiscovery(
        build.fleet(build.server("gpu-a", cards=1), build.server("gpu-b", cards=1))
    )
    async with kit.running_allocator(sim.url, discovery) as client:
        two = await attacker.run_pod(
            "two", spread(build, ("gpu-a", 0), ("gpu-b", 0)), limits=asking(2)
        )
        await settled(kit, sim, cluster, [two])
        assert cluster.holders() == {}
        await honest_books(kit, client, cluster, "gpu-a")
        metrics = (await client.get("/metrics")).text
    assert "2 servers" in refusals(sim, two)[0]["message"]
    assert refused_count(metrics) == 1.0


async def test_forged_annotation_naming_a_server_outside_the_fleet_books_nothing(
    build, kit, sim, cluster, attacker
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=1)))
    async with kit.running_allocator(sim.url, discovery) as client:
        ghost = await attacker.run_pod("ghost", devices(build, "gpu-ghost", 0), limits=asking(1))
        await settled(kit, sim, cluster, [ghost])
        assert cluster.holders() == {}
        assert cluster.lease("gpu-ghost") is None
        await honest_books(kit, client, cluster, "gpu-a")
    assert "gpu-ghost is not in the fleet" in refusals(sim, ghost)[0]["message"]


async def test_forged_pod_of_the_default_scheduler_is_refused_with_an_event(
    build, kit, sim, cluster, attacker
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=1)))
    async with kit.running_allocator(sim.url, discovery) as client:
        other = await attacker.run_pod(
            "other", devices(build, "gpu-a", 0), limits=asking(1), scheduler="default-scheduler"
        )
        await settled(kit, sim, cluster, [other])
        assert cluster.holders() == {}
        await honest_books(kit, client, cluster, "gpu-a")
        metrics = (await client.get("/metrics")).text
    assert "default-scheduler" in refusals(sim, other)[0]["message"]
    assert refused_count(metrics) == 1.0


async def test_a_refused_pod_is_reported_once_however_many_sweeps_pass(
    build, kit, sim, cluster, attacker
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=1)))
    env = {"RGPU_BOOKING_TTL_SECONDS": "0.6"}  # a sweep every 0.2 s
    async with kit.running_allocator(sim.url, discovery, **env) as client:
        forger = await attacker.run_pod("forger", devices(build, "gpu-a", 0))
        await settled(kit, sim, cluster, [forger])
        for round_ in range(2):
            # A booking left to lapse: only a sweep removes it, so its removal proves that a
            # sweep (which queues every pod needing repair) ran after the refusal.
            await client.post("/v1/allocations", json=kit.ask(cluster.pod(f"lapsed-{round_}")))
            await kit.wait_for(lambda: cluster.holders() == {"gpu-a": []})
        metrics = (await client.get("/metrics")).text
    assert len(refusals(sim, forger)) == 1
    assert refusals(sim, forger)[0].get("count", 1) == 1
    assert refused_count(metrics) == 1.0


async def test_forged_annotation_with_a_number_of_thousands_of_digits_is_refused(
    build, kit, sim, cluster, attacker
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=1)))
    huge = f"gpu-a/{build.uuid('gpu-a', 0)},RemoteGPU,{'9' * 5000},100:;"
    async with kit.running_allocator(sim.url, discovery) as client:
        forger = await attacker.run_pod("huge", huge, limits=asking(1))
        await settled(kit, sim, cluster, [forger])
        await honest_books(kit, client, cluster, "gpu-a")
        ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert "cannot be read" in refusals(sim, forger)[0]["message"]


@pytest.mark.parametrize(
    ("namespace", "labels"),
    [("kube-system", {}), ("lupine", {"rgpu.io/webhook": "ignore"})],
    ids=["kube-system", "labelled-ignore"],
)
async def test_a_pod_in_a_namespace_the_webhook_skips_books_nothing_by_repair(
    build, kit, sim, cluster, attacker, namespace: str, labels: dict[str, str]
):
    if labels:
        sim.store.create("namespaces", {"metadata": {"name": namespace, "labels": labels}})
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=2)))
    async with kit.running_allocator(sim.url, discovery) as client:
        squatter = await attacker.run_pod(
            "squatter", devices(build, "gpu-a", 0, 1), limits=asking(1), namespace=namespace
        )
        await settled(kit, sim, cluster, [squatter])
        assert cluster.holders() == {}
        await honest_books(kit, client, cluster, "gpu-a")
        metrics = (await client.get("/metrics")).text
    [event] = refusals(sim, squatter)
    assert event["type"] == "Warning"
    assert f"namespace {namespace}" in event["message"]
    assert refused_count(metrics) == 1.0


async def test_a_replayed_release_of_a_running_pods_claim_is_refused_and_books_no_second_holder(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        holder = cluster.pod("holder")
        assert (await client.post("/v1/allocations", json=kit.ask(holder))).status_code == 200
        commit = await client.post(f"/v1/allocations/{holder.uid}/commit", json={"node": "c1"})
        assert commit.status_code == 200, commit.text
        cluster.bind(holder, "c1")
        released = await client.delete(f"/v1/allocations/{holder.uid}")
        assert released.status_code == 409, released.text
        body = released.json()
        assert body["code"] == "still_running"
        assert "delete the pod" in body["message"]
        waiting = await client.post("/v1/allocations", json=kit.ask(cluster.pod("waiting")))
        assert waiting.status_code == 409, waiting.text
        assert cluster.holders() == {"gpu-a": ["holder"]}


async def test_the_extenders_release_after_a_failed_binding_still_frees_the_server(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        pod = cluster.pod("unlucky")
        assert (await client.post("/v1/allocations", json=kit.ask(pod))).status_code == 200
        commit = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "c1"})
        assert commit.status_code == 200, commit.text
        # The Binding failed: the pod is still unbound, so the release goes through.
        assert (await client.delete(f"/v1/allocations/{pod.uid}")).status_code == 204
        assert not cluster.claims("gpu-a")
