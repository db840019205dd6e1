"""Queues at admission, at the allocator's boundary on kubesim: namespace quotas from the
``rgpu-queues`` ConfigMap (live changes, bad versions refused), fair share by weight, gangs
admitted whole or not at all."""

from __future__ import annotations

import importlib
from typing import Any

import anyio
import pytest

from rgpu_contracts import PodRef

pytestmark = pytest.mark.anyio

admission = importlib.import_module("services.allocator.tests.test_admission")
gated_pod, gates, holders, events, metric = (
    admission.gated_pod,
    admission.gates,
    admission.holders,
    admission.events,
    admission.metric,
)


def configure(cluster: Any, text: str) -> None:
    """Create or replace ``rgpu-queues`` with ``queues.yaml`` = ``text``."""
    body = {"metadata": {"name": "rgpu-queues"}, "data": {"queues.yaml": text}}
    store = cluster.sim.store
    if any(
        c["metadata"]["name"] == "rgpu-queues"
        for c in store.list("configmaps", namespace="rgpu-system")
    ):
        store.patch("configmaps", "rgpu-queues", {"data": body["data"]}, namespace="rgpu-system")
    else:
        store.create("configmaps", body, namespace="rgpu-system")


def team_pod(cluster: Any, name: str, namespace: str, **labels: str) -> PodRef:
    """A gated one-card pod of ``namespace``; gang labels go in ``labels`` (dashed keys)."""
    return gated_pod(cluster, name, namespace=namespace, labels=labels)


def admitted(cluster: Any, pods: list[PodRef]) -> list[str]:
    return [p.name for p in pods if not gates(cluster, p)]


async def queue(client: Any) -> dict[str, Any]:
    got: dict[str, Any] = (await client.get("/v1/queue")).json()
    return got


async def test_a_namespace_is_admitted_up_to_its_quota_and_the_rest_wait_with_the_reason(
    build, kit, sim, cluster
):
    configure(cluster, "namespaces: {ml: {cards: 2}}")
    discovery = kit.FakeDiscovery(
        build.fleet(*(build.server(f"gpu-{i}", cards=1) for i in range(5)))
    )
    async with kit.running_allocator(sim.url, discovery) as client:
        pods = [team_pod(cluster, f"p{i}", "ml") for i in range(4)]
        await kit.wait_for(lambda: len(admitted(cluster, pods)) == 2, what="two admitted")
        await anyio.sleep(0.5)
        assert len(admitted(cluster, pods)) == 2
        waiting = [p for p in pods if gates(cluster, p)]
        await kit.wait_for(lambda: events(cluster, waiting[0]), what="the quota Event")
        assert "QuotaExceeded" in events(cluster, waiting[0])[0]["message"]
        assert "holds 2 card(s) of its 2-card quota" in events(cluster, waiting[0])[0]["message"]
        shares = {n["namespace"]: n for n in (await queue(client))["namespaces"]}
        assert shares["ml"] == {"namespace": "ml", "held": 2, "quota": 2, "weight": 1}
        assert await metric(client, "rgpu_namespace_cards_quota", namespace="ml") == 2


async def test_a_quota_lowered_and_raised_live_takes_effect_at_once(build, kit, sim, cluster):
    configure(cluster, "namespaces: {ml: {cards: 1}}")
    discovery = kit.FakeDiscovery(
        build.fleet(*(build.server(f"gpu-{i}", cards=1) for i in range(4)))
    )
    async with kit.running_allocator(sim.url, discovery):
        pods = [team_pod(cluster, f"p{i}", "ml") for i in range(3)]
        await kit.wait_for(lambda: len(admitted(cluster, pods)) == 1, what="one admitted")
        configure(cluster, "namespaces: {ml: {cards: 3}}")
        await kit.wait_for(lambda: len(admitted(cluster, pods)) == 3, what="all admitted")
        configure(cluster, "namespaces: {ml: {cards: 0}}")
        late = team_pod(cluster, "late", "ml")
        await anyio.sleep(0.5)
        assert gates(cluster, late) == ["rgpu.io/admission"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("namespaces: {ml: {cards: 1", "not YAML"),
        ("namespaces: {ml: {cards: 1, color: red}}", "unknown key"),
        ("namespaces: {ml: {cards: -2}}", "expected 0.."),
        ("namespaces: {ml: {cards: 1.5}}", "expected a whole number"),
        ("namespaces: {ml: {cards: 1}}\n#" + "x" * 70_000, "more than the 65536 allowed"),
    ],
    ids=["not-yaml", "unknown-key", "negative", "not-integer", "too-long"],
)
async def test_a_bad_configuration_keeps_the_last_good_one_and_says_so(
    build, kit, sim, cluster, text: str, words: str
):
    configure(cluster, "namespaces: {ml: {cards: 1}}")
    discovery = kit.FakeDiscovery(
        build.fleet(*(build.server(f"gpu-{i}", cards=1) for i in range(3)))
    )
    async with kit.running_allocator(sim.url, discovery) as client:
        first = team_pod(cluster, "first", "ml")
        await kit.wait_for(lambda: not gates(cluster, first), what="the first admitted")
        configure(cluster, text)

        async def refused() -> bool:
            return bool((await queue(client))["configProblem"])

        await kit.wait_for(refused, what="the bad version refused")
        second = team_pod(cluster, "second", "ml")
        await anyio.sleep(0.5)
        assert gates(cluster, second) == ["rgpu.io/admission"], "the last good quota (1) holds"
        assert words in (await queue(client))["configProblem"]
        found = [
            e
            for e in cluster.sim.store.list("events", namespace="rgpu-system")
            if e["reason"] == "RemoteGPUQueuesInvalid"
        ]
        assert found and found[0]["type"] == "Warning"
        assert found[0]["involvedObject"]["name"] == "rgpu-queues"
        assert await metric(client, "rgpu_queue_config_errors_total") == 1


async def test_weights_one_and_three_share_forty_admissions_one_to_three(build, kit, sim, cluster):
    configure(cluster, "namespaces: {team-a: {weight: 1}, team-b: {weight: 3}}")
    for namespace in ("team-a", "team-b"):
        cluster.sim.store.create("namespaces", {"metadata": {"name": namespace}})
    servers = [build.server(f"gpu-{i:02}", cards=1) for i in range(40)]
    discovery = kit.FakeDiscovery(build.fleet(*servers))
    a = [team_pod(cluster, f"a-{i:02}", "team-a") for i in range(40)]
    b = [team_pod(cluster, f"b-{i:02}", "team-b") for i in range(40)]
    async with kit.running_allocator(sim.url, discovery):
        await kit.wait_for(
            lambda: len(admitted(cluster, a + b)) == 40, what="forty admitted", timeout=20
        )
        await anyio.sleep(0.3)
        got_a, got_b = len(admitted(cluster, a)), len(admitted(cluster, b))
    assert got_a + got_b == 40
    assert abs(got_a - 10) <= 1 and abs(got_b - 30) <= 1, (got_a, got_b)


async def test_a_gang_books_nothing_until_every_member_fits_then_all_at_once(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(
        build.fleet(*(build.server(f"gpu-{i}", cards=1) for i in range(3)))
    )
    async with kit.running_allocator(sim.url, discovery):
        holder = team_pod(cluster, "holder", "ml")
        await kit.wait_for(lambda: not gates(cluster, holder), what="the holder admitted")
        cluster.bind(holder)
        gang = {"rgpu.io/gang": "trainer", "rgpu.io/gang-size": "3"}
        members = [team_pod(cluster, f"worker-{i}", "ml", **gang) for i in range(3)]
        await kit.wait_for(lambda: events(cluster, members[0]), what="the gang's Event")
        await anyio.sleep(0.3)
        assert admitted(cluster, members) == []
        assert holders(cluster) == {"gpu-0": ["holder"]}
        cluster.delete(holder)
        await kit.wait_for(lambda: len(admitted(cluster, members)) == 3, what="the gang admitted")
        assert sorted(n for names in holders(cluster).values() for n in names) == [
            "worker-0",
            "worker-1",
            "worker-2",
        ]


async def test_an_incomplete_gang_waits_holding_nothing_and_says_how_many_exist(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(
        build.fleet(*(build.server(f"gpu-{i}", cards=1) for i in range(4)))
    )
    async with kit.running_allocator(sim.url, discovery) as client:
        gang = {"rgpu.io/gang": "trainer", "rgpu.io/gang-size": "3"}
        members = [team_pod(cluster, f"worker-{i}", "ml", **gang) for i in range(2)]
        await kit.wait_for(lambda: events(cluster, members[0]), what="the gang's Event")
        assert "GangIncomplete" in events(cluster, members[0])[0]["message"]
        assert "2 of 3 members exist" in events(cluster, members[0])[0]["message"]
        assert holders(cluster) == {}
        reasons = {p["pod"]["name"]: p["reason"] for p in (await queue(client))["pods"]}
        assert reasons == {"worker-0": "GangIncomplete", "worker-1": "GangIncomplete"}
        members.append(team_pod(cluster, "worker-2", "ml", **gang))
        await kit.wait_for(lambda: len(admitted(cluster, members)) == 3, what="the gang admitted")


async def test_a_gang_whose_last_booking_is_taken_meanwhile_leaves_no_claim_behind(
    build, kit, sim, cluster
):
    # Three one-card servers; only gpu-2 has a card big enough for the rival. Lease writes
    # are slowed so the leader writes the gang's three bookings one after the other while a
    # follower books gpu-2 for the rival through the filter path: the gang's third write
    # finds gpu-2 taken, and its first two must be taken back.
    servers = [
        build.server(f"gpu-{i}", cards=1, memory=80000 if i == 2 else 40000) for i in range(3)
    ]
    discovery = kit.FakeDiscovery(build.fleet(*servers))
    async with (
        kit.running_allocator(sim.url, discovery) as leader,
        kit.running_allocator(sim.url, discovery) as follower,
    ):
        assert await metric(leader, "rgpu_leader") == 1
        rival = cluster.pod("rival")
        sim.faults.set_latency(verb="update", resource="leases", seconds=0.3)
        sim.faults.set_latency(verb="create", resource="leases", seconds=0.3)
        gang = {"rgpu.io/gang": "trainer", "rgpu.io/gang-size": "3"}
        members = [team_pod(cluster, f"worker-{i}", "ml", **gang) for i in range(3)]
        await anyio.sleep(0.1)
        body = kit.ask(rival, build.container(memory=80000))
        booked = await follower.post("/v1/allocations", json=body)
        assert booked.status_code == 200, booked.text
        assert booked.json()["server"] == "gpu-2"
        await anyio.sleep(1.5)
        sim.faults.clear()
        await anyio.sleep(0.5)
        assert holders(cluster) == {"gpu-2": ["rival"]}
        assert admitted(cluster, members) == []


async def test_a_gang_whose_gates_were_lifted_in_part_gets_the_rest_lifted(
    build, kit, sim, cluster
):
    # All three bookings are written, then the gates are lifted one by one; the apiserver
    # fails the last lift. The two lifted members left the queue, so what remains no longer
    # looks like a complete gang, yet its booking stands: it must be lifted, not left waiting
    # for siblings that are already through.
    discovery = kit.FakeDiscovery(
        build.fleet(*(build.server(f"gpu-{i}", cards=1) for i in range(3)))
    )
    async with kit.running_allocator(sim.url, discovery):
        sim.faults.set_latency(verb="patch", resource="pods", seconds=0.5)
        gang = {"rgpu.io/gang": "trainer", "rgpu.io/gang-size": "3"}
        members = [team_pod(cluster, f"worker-{i}", "ml", **gang) for i in range(3)]
        await kit.wait_for(lambda: admitted(cluster, members), what="a first gate lifted")
        sim.faults.set_error(verb="patch", resource="pods", rate=1.0, code=500)
        await anyio.sleep(1.5)
        assert len(admitted(cluster, members)) < 3
        assert sorted(n for names in holders(cluster).values() for n in names) == [
            "worker-0",
            "worker-1",
            "worker-2",
        ]
        sim.faults.clear()
        await kit.wait_for(lambda: len(admitted(cluster, members)) == 3, what="every gate lifted")


async def test_a_pod_its_quota_holds_back_does_not_preempt(build, kit, sim, cluster):
    configure(cluster, "namespaces: {ml: {cards: 1}}")
    cluster.sim.store.create("namespaces", {"metadata": {"name": "other"}})
    discovery = kit.FakeDiscovery(
        build.fleet(build.server("gpu-a", cards=1), build.server("gpu-b", cards=1))
    )
    async with kit.running_allocator(sim.url, discovery):
        trainer = gated_pod(cluster, "trainer", priority=10, namespace="ml")
        filler = gated_pod(cluster, "filler", priority=10, namespace="other")
        await kit.wait_for(
            lambda: not gates(cluster, trainer) and not gates(cluster, filler), what="both admitted"
        )
        cluster.bind(trainer)
        cluster.bind(filler)
        # ml holds its one card: evicting the other namespace's filler would free a server
        # serve could never book.
        serve = gated_pod(cluster, "serve", priority=1000, namespace="ml")
        await kit.wait_for(lambda: events(cluster, serve), what="serve's waiting Event")
        await anyio.sleep(1.0)
        for server in ("gpu-a", "gpu-b"):
            annotations = (cluster.lease(server) or {}).get("metadata", {}).get("annotations", {})
            assert "rgpu.io/nomination" not in annotations, server
        pods = cluster.sim.store.list("pods")
        assert {"trainer", "filler"} <= {p["metadata"]["name"] for p in pods}
        assert not any(p["metadata"].get("deletionTimestamp") for p in pods)
        assert "QuotaExceeded" in events(cluster, serve)[0]["message"]


async def test_a_pod_at_its_quota_whose_gate_lift_failed_is_lifted_on_its_own_booking(
    build, kit, sim, cluster
):
    # The booking is written, the lift fails: the pod's namespace now holds its one card with
    # that very booking, which must not count against the pod a second time on the retry.
    configure(cluster, "namespaces: {ml: {cards: 1}}")
    discovery = kit.FakeDiscovery(
        build.fleet(build.server("gpu-a", cards=1), build.server("gpu-b", cards=1))
    )
    async with kit.running_allocator(sim.url, discovery):
        sim.faults.set_error(verb="patch", resource="pods", rate=1.0, code=500)
        trainer = team_pod(cluster, "trainer", "ml")
        await kit.wait_for(lambda: holders(cluster), what="the booking written")
        await anyio.sleep(1.0)
        assert gates(cluster, trainer)
        booked = holders(cluster)
        sim.faults.clear()
        await kit.wait_for(lambda: not gates(cluster, trainer), what="the gate lifted", timeout=5)
        assert holders(cluster) == booked
