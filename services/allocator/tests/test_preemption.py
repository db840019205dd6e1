"""Preemption for remote GPUs (docs/design.md §11) at the service boundary: the real app on
kubesim's apiserver over HTTP, evicting through kubesim's Eviction API (PodDisruptionBudgets
included)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping

import anyio
import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

import rgpu_testkit as testkit
from rgpu_allocator import create_app
from rgpu_allocator.annotations import ANNOTATION_RETRY_AT
from rgpu_allocator.waiters import COOL_DOWN
from rgpu_contracts import PodRef, PodUID
from rgpu_kubesim import ApiError
from rgpu_placement import ANNOTATION_NOMINATION

pytestmark = pytest.mark.anyio

CLASSES = {"batch": 10, "standard": 100, "urgent": 1000, "urgent-polite": 1000}


def install_classes(cluster) -> None:
    for name, value in CLASSES.items():
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        if name.endswith("-polite"):
            body["preemptionPolicy"] = "Never"
        cluster.sim.store.create("priorityclasses", body)


def make_pod(
    cluster,
    name: str,
    priority_class: str | None = None,
    *,
    grace: int = 1,
    labels: Mapping[str, str] | None = None,
) -> PodRef:
    spec: dict[str, object] = {"terminationGracePeriodSeconds": grace}
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    manifest = testkit.pod_manifest(
        name=name, namespace="ml", scheduler="rgpu-scheduler", labels=labels, spec=spec
    )
    made = cluster.sim.store.create("pods", manifest)
    return PodRef(uid=PodUID(made["metadata"]["uid"]), namespace="ml", name=name)


async def hold(client: httpx.AsyncClient, cluster, pod: PodRef, kit, *containers) -> str:
    """Book, commit and bind ``pod`` (Running); returns its server."""
    booked = await client.post("/v1/allocations", json=kit.ask(pod, *containers))
    assert booked.status_code == 200, booked.text
    commit = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "client-1"})
    assert commit.status_code == 200, commit.text
    cluster.bind(pod)
    return booked.json()["server"]


def nomination(cluster, server: str) -> dict[str, object] | None:
    lease = cluster.lease(server)
    text = (lease or {}).get("metadata", {}).get("annotations", {}).get(ANNOTATION_NOMINATION)
    return orjson.loads(text) if text else None


def terminating(cluster, pod: PodRef) -> bool:
    try:
        got = cluster.sim.store.get("pods", pod.name, namespace=pod.namespace)
    except ApiError:
        return True
    return bool(got["metadata"].get("deletionTimestamp"))


def finish(cluster, pod: PodRef) -> None:
    """What the kubelet does at the end of a graceful deletion: delete with grace 0."""
    with contextlib.suppress(ApiError):
        cluster.sim.store.delete("pods", pod.name, namespace=pod.namespace, grace_period_seconds=0)


def events_about(cluster, pod: PodRef, reason: str) -> list[dict[str, object]]:
    return [
        e
        for e in cluster.sim.store.list("events", namespace=pod.namespace)
        if e["reason"] == reason and e["involvedObject"]["name"] == pod.name
    ]


def metric(text: str, line: str) -> float:
    found = [row for row in text.splitlines() if row.startswith(line + " ")]
    return float(found[0].split()[-1]) if found else 0.0


async def fleet_seen(client: httpx.AsyncClient, revision: int) -> None:
    async def seen() -> bool:
        return (await client.get("/v1/status")).json()["fleetRevision"] == revision

    await testkit.eventually(seen, what=f"the allocator saw fleet revision {revision}")


def one_server_batch_and_urgent(build, kit, cluster):
    """One server, and a batch and an urgent pod (the priority classes installed)."""
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    return discovery, make_pod(cluster, "batch", "batch"), make_pod(cluster, "urgent", "urgent")


@contextlib.asynccontextmanager
async def allocator(
    kit,
    sim,
    discovery,
    *,
    clock=None,
    registry: CollectorRegistry | None = None,
    **env: str,
) -> AsyncIterator[httpx.AsyncClient]:
    extra = {} if clock is None else {"clock": clock}
    app = create_app(
        kit.settings_for(sim.url, **env),
        discovery_transport=discovery.transport,
        registry=registry,
        **extra,
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


async def test_an_urgent_pod_takes_the_server_of_a_batch_pod(build, kit, sim, cluster):
    discovery, batch, urgent = one_server_batch_and_urgent(build, kit, cluster)
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, batch, kit)
        refused = await client.post("/v1/allocations", json=kit.ask(urgent))
        assert refused.status_code == 409
        promised = nomination(cluster, "gpu-a")
        assert promised is not None
        assert promised["pod"]["uid"] == urgent.uid
        assert promised["priority"] == 1000
        assert [v["name"] for v in promised["victims"]] == ["batch"]
        assert terminating(cluster, batch)

        async def told() -> bool:
            return bool(events_about(cluster, batch, "Preempted")) and bool(
                events_about(cluster, urgent, "Preempting")
            )

        await kit.wait_for(told, what="Events on the victim and the preemptor")
        victim_event = events_about(cluster, batch, "Preempted")[0]
        assert "preempted by ml/urgent for a remote GPU" in victim_event["message"]
        still_held = await client.post("/v1/allocations", json=kit.ask(urgent))
        assert still_held.status_code == 409
        finish(cluster, batch)

        async def booked() -> bool:
            got = await client.post("/v1/allocations", json=kit.ask(urgent))
            return got.status_code == 200 and got.json()["server"] == "gpu-a"

        await kit.wait_for(booked, what="the preemptor booked the freed server")
        metrics = (await client.get("/metrics")).text
    assert nomination(cluster, "gpu-a") is None
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="nominated"}') == 1
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="pending"}') >= 1
    assert metric(metrics, "rgpu_allocator_preemption_victims_total") == 1


async def test_an_urgent_pod_books_at_once_when_its_victim_had_not_started(
    build, kit, sim, cluster
):
    discovery, batch, urgent = one_server_batch_and_urgent(build, kit, cluster)
    async with allocator(kit, sim, discovery) as client:
        booked = await client.post("/v1/allocations", json=kit.ask(batch))
        assert booked.status_code == 200, booked.text
        # The batch pod is booked but not bound: its eviction deletes it on the spot, so the
        # urgent pod need not be refused and wait out kube-scheduler's backoff.
        got = await client.post("/v1/allocations", json=kit.ask(urgent))
        assert got.status_code == 200, got.text
        assert got.json()["server"] == "gpu-a"
        metrics = (await client.get("/metrics")).text
    assert cluster.holders()["gpu-a"] == ["urgent"]
    assert nomination(cluster, "gpu-a") is None
    assert terminating(cluster, batch)
    assert events_about(cluster, batch, "Preempted")
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="nominated"}') == 1
    assert metric(metrics, 'rgpu_allocator_decisions_total{outcome="allocated",reason=""}') == 2


@pytest.mark.parametrize(
    ("holder_class", "pod_class"),
    [
        pytest.param(None, None, id="priority-0-never-preempts"),
        pytest.param("batch", "urgent-polite", id="policy-Never-never-preempts"),
        pytest.param("urgent", "urgent", id="equal-priority-is-never-preempted"),
        pytest.param("urgent", "batch", id="higher-priority-is-never-preempted"),
    ],
)
async def test_no_preemption_without_a_strictly_higher_priority_that_may_preempt(
    build, kit, sim, cluster, holder_class, pod_class
):
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    holder = make_pod(cluster, "holder", holder_class)
    asking = make_pod(cluster, "asking", pod_class)
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, holder, kit)
        refused = await client.post("/v1/allocations", json=kit.ask(asking))
        metrics = (await client.get("/metrics")).text
    assert refused.status_code == 409
    assert nomination(cluster, "gpu-a") is None
    assert not terminating(cluster, holder)
    assert metric(metrics, "rgpu_allocator_preemption_victims_total") == 0


async def test_preemption_is_off_when_the_setting_says_so(build, kit, sim, cluster):
    discovery, batch, urgent = one_server_batch_and_urgent(build, kit, cluster)
    async with allocator(kit, sim, discovery, RGPU_PREEMPTION="off") as client:
        await hold(client, cluster, batch, kit)
        refused = await client.post("/v1/allocations", json=kit.ask(urgent))
    assert refused.status_code == 409
    assert nomination(cluster, "gpu-a") is None
    assert not terminating(cluster, batch)


async def test_a_disruption_budget_moves_preemption_to_the_next_server(build, kit, sim, cluster):
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    # gpu-a is the cheaper server (the lower-priority, younger victim) but its holder is
    # protected by a budget that allows no disruption.
    guarded = make_pod(cluster, "guarded", "batch", labels={"app": "guarded"})
    other = make_pod(cluster, "other", "standard")
    urgent = make_pod(cluster, "urgent", "urgent")
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": "ml"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    cluster.sim.store.create("poddisruptionbudgets", budget)
    async with allocator(kit, sim, discovery) as client:
        assert await hold(client, cluster, guarded, kit) == "gpu-a"
        assert await hold(client, cluster, other, kit) == "gpu-b"
        refused = await client.post("/v1/allocations", json=kit.ask(urgent))
        metrics = (await client.get("/metrics")).text
    assert refused.status_code == 409
    assert nomination(cluster, "gpu-a") is None
    assert nomination(cluster, "gpu-b")["pod"]["uid"] == urgent.uid
    assert not terminating(cluster, guarded)
    assert terminating(cluster, other)
    assert metric(metrics, "rgpu_allocator_preemption_victims_total") == 1


async def test_a_lower_priority_pod_cannot_book_a_nominated_server(build, kit, sim, cluster):
    discovery, batch, urgent, standard = one_server_three_classes(build, kit, cluster)
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, batch, kit)
        await client.post("/v1/allocations", json=kit.ask(urgent))
        finish(cluster, batch)

        async def freed() -> bool:
            return cluster.holders().get("gpu-a") == []

        await kit.wait_for(freed, what="the victim's claim released")
        cut_in = await client.post("/v1/allocations", json=kit.ask(standard))
        assert cut_in.status_code == 409
        why = await client.post("/v1/allocations", json=kit.ask(standard, dry_run=True))
        assert "held by ml/urgent" in why.text
        nominee = await client.post("/v1/allocations", json=kit.ask(urgent))
    assert nominee.status_code == 200
    assert nominee.json()["server"] == "gpu-a"
    assert nomination(cluster, "gpu-a") is None


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_a_nomination_expires_after_the_ttl_plus_the_victims_grace(build, kit, sim, cluster):
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    batch = make_pod(cluster, "batch", "batch", grace=5)
    urgent = make_pod(cluster, "urgent", "urgent")
    standard = make_pod(cluster, "standard", "standard")
    clock = Clock(time.time())
    async with allocator(kit, sim, discovery, clock=clock) as client:
        await hold(client, cluster, batch, kit)
        await client.post("/v1/allocations", json=kit.ask(urgent))
        promised = nomination(cluster, "gpu-a")
        assert promised["expiresAt"] == pytest.approx(promised["nominatedAt"] + 30 + 5)
        finish(cluster, batch)

        async def freed() -> bool:
            return cluster.holders().get("gpu-a") == []

        await kit.wait_for(freed, what="the victim's claim released")
        before = await client.post("/v1/allocations", json=kit.ask(standard))
        clock.now = promised["expiresAt"] + 0.1
        after = await client.post("/v1/allocations", json=kit.ask(standard))
    assert before.status_code == 409
    assert after.status_code == 200, after.text


async def test_two_replicas_never_evict_twice_for_one_pod(build, kit, sim, cluster):
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    batch = make_pod(cluster, "batch", "batch")
    other = make_pod(cluster, "other", "standard")
    urgent = make_pod(cluster, "urgent", "urgent")
    registries = (CollectorRegistry(), CollectorRegistry())
    async with (
        allocator(kit, sim, discovery, registry=registries[0]) as a,
        allocator(kit, sim, discovery, registry=registries[1]) as b,
    ):
        await hold(a, cluster, batch, kit)
        await hold(b, cluster, other, kit)

        async def wait_cached(client: httpx.AsyncClient) -> None:
            async def both() -> bool:
                claims = (await client.get("/v1/claims")).json()["claims"]
                return len(claims) == 2 and all(c["state"] == "bound" for c in claims)

            await kit.wait_for(both, what="both holders seen bound")

        await wait_cached(a)
        await wait_cached(b)

        async def ask(client: httpx.AsyncClient) -> None:
            await client.post("/v1/allocations", json=kit.ask(urgent))

        async with anyio.create_task_group() as tg:
            for client in (a, b, a, b):
                tg.start_soon(ask, client)
        texts = [(await c.get("/metrics")).text for c in (a, b)]
    victims = sum(metric(t, "rgpu_allocator_preemption_victims_total") for t in texts)
    assert victims == 1
    assert terminating(cluster, batch)
    assert not terminating(cluster, other)
    nominated = [s for s in ("gpu-a", "gpu-b") if nomination(cluster, s) is not None]
    assert nominated == ["gpu-a"]


async def test_card_granularity_frees_just_enough_cards(build, kit, sim, cluster):
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=4)))
    one = make_pod(cluster, "one", "batch")
    two = make_pod(cluster, "two", "batch")
    three = make_pod(cluster, "three", "batch")
    urgent = make_pod(cluster, "urgent", "urgent")
    async with allocator(kit, sim, discovery, RGPU_GRANULARITY="card") as client:
        await hold(client, cluster, one, kit, build.container(count=1))
        await hold(client, cluster, two, kit, build.container(count=2))
        await hold(client, cluster, three, kit, build.container(count=1))
        refused = await client.post(
            "/v1/allocations", json=kit.ask(urgent, build.container(count=2))
        )
        assert refused.status_code == 409
        promised = nomination(cluster, "gpu-a")
        assert [v["name"] for v in promised["victims"]] == ["two"]
        two_cards = next(c["cards"] for c in cluster.claims("gpu-a") if c["pod"]["name"] == "two")
        assert sorted(promised["cards"]) == sorted(two_cards)
        assert [terminating(cluster, p) for p in (one, two, three)] == [False, True, False]
        finish(cluster, two)

        async def booked() -> bool:
            ask = kit.ask(urgent, build.container(count=2))
            got = await client.post("/v1/allocations", json=ask)
            return got.status_code == 200 and sorted(got.json()["cards"]) == sorted(two_cards)

        await kit.wait_for(booked, what="the preemptor booked the freed cards")


def one_server_three_classes(build, kit, cluster):
    """One server, and a batch, an urgent and a standard pod (the priority classes installed)."""
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    pods = (make_pod(cluster, name, name) for name in ("batch", "urgent", "standard"))
    return (discovery, *pods)


async def preempted_and_freed(client, kit, cluster, victim: PodRef, nominee: PodRef) -> None:
    """``nominee`` is refused, nominated on the victim's server, and the victim is gone."""
    refused = await client.post("/v1/allocations", json=kit.ask(nominee))
    assert refused.status_code == 409
    finish(cluster, victim)

    async def freed() -> bool:
        return cluster.holders().get("gpu-a") == []

    await kit.wait_for(freed, what="the victim's claim released")


async def test_a_nomination_ends_when_its_pod_goes_away(build, kit, sim, cluster):
    discovery, batch, urgent, standard = one_server_three_classes(build, kit, cluster)
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, batch, kit)
        await preempted_and_freed(client, kit, cluster, batch, urgent)
        finish(cluster, urgent)

        async def booked() -> bool:
            got = await client.post("/v1/allocations", json=kit.ask(standard))
            return got.status_code == 200

        await kit.wait_for(booked, what="the server bookable once the nominee is gone")


async def test_a_pod_of_higher_priority_than_the_nominee_may_book_its_server(
    build, kit, sim, cluster
):
    install_classes(cluster)
    cluster.sim.store.create(
        "priorityclasses",
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "critical"},
            "value": 5000,
        },
    )
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    batch = make_pod(cluster, "batch", "batch")
    urgent = make_pod(cluster, "urgent", "urgent")
    critical = make_pod(cluster, "critical", "critical")
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, batch, kit)
        await preempted_and_freed(client, kit, cluster, batch, urgent)
        got = await client.post("/v1/allocations", json=kit.ask(critical))
    assert got.status_code == 200, got.text
    assert got.json()["server"] == "gpu-a"


async def test_victims_left_when_the_apiserver_sheds_an_eviction_go_on_the_next_attempt(
    build, kit, sim, cluster
):
    install_classes(cluster)
    fleet = build.fleet(build.server("gpu-a", cards=2), build.server("gpu-b", cards=2))
    discovery = kit.FakeDiscovery(fleet)
    # gpu-a's victims are the cheaper pair. The apiserver sheds the second real eviction
    # (after two dry runs and the first): taking back the promise would leave the urgent pod
    # free to book gpu-b once it frees, and batch-1 evicted for nothing.
    batch = (make_pod(cluster, "batch-1", "batch"), make_pod(cluster, "batch-2", "batch"))
    others = (make_pod(cluster, "std-1", "standard"), make_pod(cluster, "std-2", "standard"))
    urgent = make_pod(cluster, "urgent", "urgent")
    one, two = build.container(count=1), build.container(count=2)
    async with allocator(kit, sim, discovery, RGPU_GRANULARITY="card") as client:
        for pod in batch:
            assert await hold(client, cluster, pod, kit, one) == "gpu-a"
        for pod in others:
            assert await hold(client, cluster, pod, kit, one) == "gpu-b"
        evictions = {"verb": "create", "resource": "pods/eviction"}
        sim.faults.set_error(**evictions, rate=1.0, code=429, retry_after=1, skip=3)
        refused = await client.post("/v1/allocations", json=kit.ask(urgent, two))
        assert refused.status_code == 409
        assert terminating(cluster, batch[0]) and not terminating(cluster, batch[1])
        assert nomination(cluster, "gpu-a")["pod"]["uid"] == urgent.uid
        sim.faults.set_error(**evictions, rate=0.0)
        for pod in others:
            finish(cluster, pod)
        await kit.wait_for(lambda: cluster.holders().get("gpu-b") == [], what="gpu-b free")
        held = await client.post("/v1/allocations", json=kit.ask(urgent, two))
        assert held.status_code == 409, held.text
        assert terminating(cluster, batch[1])
        for pod in batch:
            finish(cluster, pod)
        await kit.wait_for(lambda: cluster.holders().get("gpu-a") == [], what="gpu-a free")
        got = await client.post("/v1/allocations", json=kit.ask(urgent, two))
        metrics = (await client.get("/metrics")).text
    assert got.status_code == 200, got.text
    assert got.json()["server"] == "gpu-a"
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="partial"}') == 1
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="resumed"}') == 1
    assert metric(metrics, "rgpu_allocator_preemption_victims_total") == 2


async def test_a_victim_evicted_a_moment_ago_is_not_evicted_again_before_the_watch_says_so(
    build, kit, sim, cluster
):
    # The pod watch tells of an eviction a moment after it is made; the nominee's next attempt
    # in that moment finds its victim still there in the cache. Stalled here for good.
    discovery, batch, urgent = one_server_batch_and_urgent(build, kit, cluster)
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, batch, kit)
        for verb in ("watch", "list"):
            sim.faults.set_error(verb=verb, resource="pods", rate=1.0, code=500)
        sim.faults.cut_watches()
        for _ in range(3):
            refused = await client.post("/v1/allocations", json=kit.ask(urgent))
            assert refused.status_code == 409
        metrics = (await client.get("/metrics")).text
    assert terminating(cluster, batch)
    assert len(events_about(cluster, batch, "Preempted")) == 1
    assert metric(metrics, "rgpu_allocator_preemption_victims_total") == 1
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="pending"}') == 2


@pytest.mark.parametrize("code", [500, 429])
async def test_a_failed_eviction_keeps_the_refusal_and_takes_the_nomination_back(
    build, kit, sim, cluster, code
):
    # A 429 without the DisruptionBudget cause is the apiserver shedding load: no budget
    # said no, so the preemption failed (retried later) like on a 500, not refused for good.
    discovery, batch, urgent = one_server_batch_and_urgent(build, kit, cluster)
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, batch, kit)
        sim.faults.set_error(verb="create", resource="pods/eviction", rate=1.0, code=code)
        refused = await client.post("/v1/allocations", json=kit.ask(urgent))
        metrics = (await client.get("/metrics")).text
    assert refused.status_code == 409
    assert nomination(cluster, "gpu-a") is None
    assert not terminating(cluster, batch)
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="failed"}') == 1
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="blocked"}') == 0


async def test_the_preemptor_books_the_server_freed_for_it_even_when_another_frees_first(
    build, kit, sim, cluster
):
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    # gpu-a sorts first but its holder cannot be preempted, so gpu-b is freed for urgent.
    peer = make_pod(cluster, "peer", "urgent")
    batch = make_pod(cluster, "batch", "batch")
    urgent = make_pod(cluster, "urgent", "urgent")
    async with allocator(kit, sim, discovery) as client:
        assert await hold(client, cluster, peer, kit) == "gpu-a"
        assert await hold(client, cluster, batch, kit) == "gpu-b"
        await refused_and_nominated(client, kit, cluster, urgent, "gpu-b")
        finish(cluster, peer)
        finish(cluster, batch)

        async def both_free() -> bool:
            holders = cluster.holders()
            return holders.get("gpu-a") == [] and holders.get("gpu-b") == []

        await kit.wait_for(both_free, what="both servers' claims released")
        got = await client.post("/v1/allocations", json=kit.ask(urgent))
    assert got.status_code == 200, got.text
    assert got.json()["server"] == "gpu-b"
    assert nomination(cluster, "gpu-b") is None


def budget(cluster, name: str, **spec: object) -> None:
    cluster.sim.store.create(
        "poddisruptionbudgets",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {**spec, "selector": {"matchLabels": {"app": name}}},
        },
    )


async def test_a_server_with_one_guarded_victim_loses_none_of_its_victims(build, kit, sim, cluster):
    install_classes(cluster)
    fleet = build.fleet(build.server("gpu-a", cards=2), build.server("gpu-b", cards=2))
    discovery = kit.FakeDiscovery(fleet)
    # gpu-a is the cheaper server (batch victims); its first victim (by name) may be disrupted,
    # its second may not, so none of them may go and gpu-b is freed instead.
    open_ = make_pod(cluster, "a-open", "batch", labels={"app": "open"})
    guarded = make_pod(cluster, "b-guarded", "batch", labels={"app": "guarded"})
    others = (make_pod(cluster, "c-other", "standard"), make_pod(cluster, "d-other", "standard"))
    urgent = make_pod(cluster, "urgent", "urgent")
    budget(cluster, "open", maxUnavailable=1, unhealthyPodEvictionPolicy="AlwaysAllow")
    budget(cluster, "guarded", minAvailable=1)
    one = build.container(count=1)
    async with allocator(kit, sim, discovery, RGPU_GRANULARITY="card") as client:
        assert await hold(client, cluster, open_, kit, one) == "gpu-a"
        assert await hold(client, cluster, guarded, kit, one) == "gpu-a"
        for other in others:
            assert await hold(client, cluster, other, kit, one) == "gpu-b"
        refused = await client.post(
            "/v1/allocations", json=kit.ask(urgent, build.container(count=2))
        )
        metrics = (await client.get("/metrics")).text
    assert refused.status_code == 409
    assert not terminating(cluster, open_)
    assert not terminating(cluster, guarded)
    assert nomination(cluster, "gpu-a") is None
    assert nomination(cluster, "gpu-b")["pod"]["uid"] == urgent.uid
    assert all(terminating(cluster, other) for other in others)
    assert metric(metrics, "rgpu_allocator_preemption_victims_total") == 2


def ready(cluster, pod: PodRef) -> None:
    conditions = [{"type": "Ready", "status": "True"}]
    cluster.sim.store.patch(
        "pods",
        pod.name,
        {"status": {"phase": "Running", "conditions": conditions}},
        namespace=pod.namespace,
        subresource="status",
    )


async def test_victims_one_budget_cannot_all_spare_are_not_evicted_and_the_next_server_is_freed(
    build, kit, sim, cluster
):
    install_classes(cluster)
    fleet = build.fleet(build.server("gpu-a", cards=2), build.server("gpu-b", cards=2))
    discovery = kit.FakeDiscovery(fleet)
    # One budget allows one disruption for both of gpu-a's victims: each dry run is allowed
    # (a dry run spends nothing), but evicting both is not, so neither may go.
    shared = tuple(make_pod(cluster, n, "batch", labels={"app": "shared"}) for n in ("a-1", "a-2"))
    others = (make_pod(cluster, "c-other", "standard"), make_pod(cluster, "d-other", "standard"))
    urgent = make_pod(cluster, "urgent", "urgent")
    budget(cluster, "shared", maxUnavailable=1)
    one = build.container(count=1)
    async with allocator(kit, sim, discovery, RGPU_GRANULARITY="card") as client:
        for pod in shared:
            assert await hold(client, cluster, pod, kit, one) == "gpu-a"
            ready(cluster, pod)
        for other in others:
            assert await hold(client, cluster, other, kit, one) == "gpu-b"
        refused = await client.post(
            "/v1/allocations", json=kit.ask(urgent, build.container(count=2))
        )
        metrics = (await client.get("/metrics")).text
    assert refused.status_code == 409
    assert not any(terminating(cluster, p) for p in shared)
    assert nomination(cluster, "gpu-a") is None
    assert nomination(cluster, "gpu-b")["pod"]["uid"] == urgent.uid
    assert all(terminating(cluster, other) for other in others)
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="partial"}') == 0
    assert metric(metrics, "rgpu_allocator_preemption_victims_total") == 2


async def test_two_preemptions_at_once_never_overspend_one_budget_between_them(
    build, kit, sim, cluster
):
    install_classes(cluster)
    fleet = build.fleet(
        build.server("gpu-a", cards=2), build.server("gpu-b", cards=2, memory=80000)
    )
    discovery = kit.FakeDiscovery(fleet)
    # One budget spares two of the four victims: either urgent pod's two fit in it alone, but
    # not both pairs. Rehearsed side by side (one needs gpu-b's memory, the other takes
    # gpu-a), each would see room for its own, and their evictions, interleaved, would be
    # refused half-way: victims evicted for nothing.
    names = ("a-1", "a-2", "b-1", "b-2")
    shared = tuple(make_pod(cluster, n, "batch", labels={"app": "shared"}) for n in names)
    urgent = tuple(make_pod(cluster, n, "urgent") for n in ("urgent-1", "urgent-2"))
    budget(cluster, "shared", maxUnavailable=2)
    one = build.container(count=1)
    async with allocator(kit, sim, discovery, RGPU_GRANULARITY="card") as client:
        for pod in shared:
            await hold(client, cluster, pod, kit, one)
            ready(cluster, pod)

        async def ask(pod: PodRef, memory: int) -> None:
            wanted = build.container(count=2, memory=memory)
            await client.post("/v1/allocations", json=kit.ask(pod, wanted))

        # Slow evictions keep both preemptions' evictions in flight together.
        sim.faults.set_latency(verb="create", resource="pods/eviction", seconds=0.2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, urgent[0], 0)
            tg.start_soon(ask, urgent[1], 60000)
        metrics = (await client.get("/metrics")).text
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="partial"}') == 0
    assert metric(metrics, "rgpu_allocator_preemption_victims_total") == 2
    assert sum(terminating(cluster, p) for p in shared) == 2


async def test_a_budget_no_set_of_victims_can_spare_evicts_nobody(build, kit, sim, cluster):
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=2)))
    shared = tuple(make_pod(cluster, n, "batch", labels={"app": "shared"}) for n in ("a-1", "a-2"))
    urgent = make_pod(cluster, "urgent", "urgent")
    budget(cluster, "shared", maxUnavailable=1)
    one = build.container(count=1)
    async with allocator(kit, sim, discovery, RGPU_GRANULARITY="card") as client:
        for pod in shared:
            await hold(client, cluster, pod, kit, one)
            ready(cluster, pod)
        refused = await client.post(
            "/v1/allocations", json=kit.ask(urgent, build.container(count=2))
        )
        metrics = (await client.get("/metrics")).text
    assert refused.status_code == 409
    assert not any(terminating(cluster, p) for p in shared)
    assert nomination(cluster, "gpu-a") is None
    assert metric(metrics, 'rgpu_allocator_preemptions_total{outcome="blocked"}') == 1
    assert metric(metrics, "rgpu_allocator_preemption_victims_total") == 0


async def test_the_nominee_waits_for_its_server_when_another_frees_while_victims_terminate(
    build, kit, sim, cluster
):
    install_classes(cluster)
    fleet = build.fleet(build.server("gpu-a", cards=2), build.server("gpu-b", cards=2))
    discovery = kit.FakeDiscovery(fleet)
    # gpu-a's holder cannot be preempted, so gpu-b is freed for urgent; gpu-a frees first, and
    # the replica that did not preempt is asked while gpu-b's victim still terminates.
    peer = make_pod(cluster, "peer", "urgent")
    batch = make_pod(cluster, "batch", "batch", grace=30)
    urgent = make_pod(cluster, "urgent", "urgent")
    both = build.container(count=2)
    registries = (CollectorRegistry(), CollectorRegistry())
    async with (
        allocator(kit, sim, discovery, registry=registries[0], RGPU_GRANULARITY="card") as a,
        allocator(kit, sim, discovery, registry=registries[1], RGPU_GRANULARITY="card") as b,
    ):
        assert await hold(a, cluster, peer, kit, both) == "gpu-a"
        assert await hold(a, cluster, batch, kit, both) == "gpu-b"
        refused = await a.post("/v1/allocations", json=kit.ask(urgent, both))
        assert refused.status_code == 409
        assert nomination(cluster, "gpu-b")["pod"]["uid"] == urgent.uid
        assert terminating(cluster, batch)
        finish(cluster, peer)

        async def gpu_a_free_on_b() -> bool:
            claims = (await b.get("/v1/claims")).json()["claims"]
            return [c["pod"]["name"] for c in claims] == ["batch"]

        await kit.wait_for(gpu_a_free_on_b, what="gpu-a's release seen by the other replica")
        waiting = await b.post("/v1/allocations", json=kit.ask(urgent, both))
        assert waiting.status_code == 409, waiting.text
        why = await b.post("/v1/allocations", json=kit.ask(urgent, both, dry_run=True))
        assert "waits for this server while its victims leave" in why.text
        assert cluster.holders().get("gpu-a") == []
        finish(cluster, batch)

        async def booked() -> bool:
            got = await b.post("/v1/allocations", json=kit.ask(urgent, both))
            return got.status_code == 200 and got.json()["server"] == "gpu-b"

        await kit.wait_for(booked, what="the nominee booked the server freed for it")
        texts = [(await c.get("/metrics")).text for c in (a, b)]
    assert nomination(cluster, "gpu-b") is None
    assert sum(metric(t, "rgpu_allocator_preemption_victims_total") for t in texts) == 1


async def test_a_nominee_whose_server_a_higher_priority_pod_took_may_book_elsewhere(
    build, kit, sim, cluster
):
    install_classes(cluster)
    critical = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": 5000}
    cluster.sim.store.create("priorityclasses", {**critical, "metadata": {"name": "critical"}})
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    peer = make_pod(cluster, "peer", "urgent")
    batch = make_pod(cluster, "batch", "batch")
    urgent = make_pod(cluster, "urgent", "urgent")
    vip = make_pod(cluster, "vip", "critical")
    async with allocator(kit, sim, discovery) as client:
        assert await hold(client, cluster, peer, kit) == "gpu-a"
        assert await hold(client, cluster, batch, kit) == "gpu-b"
        await preempted_and_freed_on(client, kit, cluster, batch, urgent, "gpu-b")
        assert await hold(client, cluster, vip, kit) == "gpu-b"
        finish(cluster, peer)

        async def booked() -> bool:
            got = await client.post("/v1/allocations", json=kit.ask(urgent))
            return got.status_code == 200 and got.json()["server"] == "gpu-a"

        await kit.wait_for(booked, what="the overtaken nominee booked the server that freed")


def two_servers_held_by_batch(build, kit, cluster):
    """gpu-a and gpu-b, each to be held by a batch pod (30 s grace), and an urgent pod."""
    install_classes(cluster)
    servers = {name: build.server(name) for name in ("gpu-a", "gpu-b")}
    discovery = kit.FakeDiscovery(build.fleet(*servers.values()))
    batches = {name: make_pod(cluster, f"batch-{name}", "batch", grace=30) for name in servers}
    return servers, discovery, batches, make_pod(cluster, "urgent", "urgent")


async def nominated_first(client, kit, cluster, batches, urgent) -> tuple[str, str]:
    """Hold both servers, refuse the urgent pod: (the server promised to it, the other)."""
    for name, batch in batches.items():
        assert await hold(client, cluster, batch, kit) == name
    refused = await client.post("/v1/allocations", json=kit.ask(urgent))
    assert refused.status_code == 409
    first = next(name for name in batches if nomination(cluster, name))
    return first, next(name for name in batches if name != first)


async def refused_and_nominated(client, kit, cluster, pod: PodRef, server: str) -> None:
    """Ask for ``pod`` once: refused, with ``server`` promised to it."""
    refused = await client.post("/v1/allocations", json=kit.ask(pod))
    assert refused.status_code == 409
    assert nomination(cluster, server)["pod"]["uid"] == pod.uid


async def freed_for(client, kit, cluster, pod: PodRef, server: str) -> None:
    """Ask for ``pod`` until ``server`` is promised to it (a preemption there)."""

    async def promised() -> bool:
        await client.post("/v1/allocations", json=kit.ask(pod))
        found = nomination(cluster, server)
        return found is not None and found["pod"]["uid"] == pod.uid

    await kit.wait_for(promised, what=f"{server} freed for {pod.name}")


async def books(client, kit, pod: PodRef, server: str) -> None:
    """Ask for ``pod`` until it books ``server``."""

    async def booked() -> bool:
        got = await client.post("/v1/allocations", json=kit.ask(pod))
        return got.status_code == 200 and got.json()["server"] == server

    await kit.wait_for(booked, what=f"{pod.name} booked {server}")


@pytest.mark.parametrize("broken", [{"ready": False}, {"reachable": False}])
async def test_a_nominee_whose_server_breaks_while_victims_leave_frees_another(
    build, kit, sim, cluster, broken
):
    # The freed server's Node went NotReady (or lupine stopped answering) just after the
    # eviction: held to it, the urgent pod waited out the outage or its nomination (a soak:
    # 5 s and 12 s). The victim that went is lost either way; waiting adds the pod's time.
    servers, discovery, batches, urgent = two_servers_held_by_batch(build, kit, cluster)
    async with allocator(kit, sim, discovery) as client:
        first, other = await nominated_first(client, kit, cluster, batches, urgent)
        assert terminating(cluster, batches[first])
        discovery.publish(
            *(dataclasses.replace(s, **broken) if n == first else s for n, s in servers.items())
        )
        await freed_for(client, kit, cluster, urgent, other)
        finish(cluster, batches[other])
        await books(client, kit, urgent, other)


async def test_a_nominee_that_freed_a_second_server_waits_for_it_when_the_first_comes_back(
    build, kit, sim, cluster
):
    # gpu-a broke after its eviction, so gpu-b was freed too; gpu-a came back free before
    # gpu-b's victim left. Taking gpu-a then would leave gpu-b's victim evicted for nothing:
    # the newest promise is the one the pod waits for.
    install_classes(cluster)
    servers = {name: build.server(name) for name in ("gpu-a", "gpu-b")}
    discovery = kit.FakeDiscovery(build.fleet(*servers.values()))
    cheap = make_pod(cluster, "cheap", "batch", grace=30)
    dear = make_pod(cluster, "dear", "standard", grace=30)
    urgent = make_pod(cluster, "urgent", "urgent")
    async with allocator(kit, sim, discovery) as client:
        assert await hold(client, cluster, cheap, kit) == "gpu-a"
        assert await hold(client, cluster, dear, kit) == "gpu-b"
        await refused_and_nominated(client, kit, cluster, urgent, "gpu-a")
        discovery.publish(dataclasses.replace(servers["gpu-a"], ready=False), servers["gpu-b"])
        await freed_for(client, kit, cluster, urgent, "gpu-b")
        finish(cluster, cheap)
        await kit.wait_for(lambda: cluster.holders().get("gpu-a") == [], what="gpu-a free")
        discovery.publish(*servers.values())
        await fleet_seen(client, discovery.fleet.revision)
        waiting = await client.post("/v1/allocations", json=kit.ask(urgent))
        assert waiting.status_code == 409, waiting.text
        finish(cluster, dear)
        await books(client, kit, urgent, "gpu-b")


async def test_a_nominee_whose_freed_server_reports_a_client_no_claim_explains_waits_for_it(
    build, kit, sim, cluster
):
    # The victim gone, lupine still reports a client on the freed server that no claim
    # explains. Most often it is the victim's own, reported until discovery probes again:
    # freeing another server then would evict a second victim for nothing (a 5,000-pod soak:
    # 5 of 192 evictions wasted so). The pod waits for the report to clear.
    servers, discovery, batches, urgent = two_servers_held_by_batch(build, kit, cluster)
    async with allocator(kit, sim, discovery) as client:
        first, other = await nominated_first(client, kit, cluster, batches, urgent)
        finish(cluster, batches[first])
        await kit.wait_for(lambda: cluster.holders().get(first) == [], what="the victim gone")
        busy = build.server(first, busy=(0,))
        discovery.publish(*(busy if n == first else s for n, s in servers.items()))
        await fleet_seen(client, discovery.fleet.revision)
        for _ in range(3):
            refused = await client.post("/v1/allocations", json=kit.ask(urgent))
            assert refused.status_code == 409, refused.text
        assert nomination(cluster, other) is None
        assert cluster.holders().get(other) == [batches[other].name]
        discovery.publish(*servers.values())
        await fleet_seen(client, discovery.fleet.revision)
        await books(client, kit, urgent, first)


async def preempted_and_freed_on(
    client, kit, cluster, victim: PodRef, nominee: PodRef, server: str
) -> None:
    await refused_and_nominated(client, kit, cluster, nominee, server)
    finish(cluster, victim)

    async def freed() -> bool:
        return cluster.holders().get(server) == []

    await kit.wait_for(freed, what="the victim's claim released")


async def test_the_nominee_is_nudged_first_when_its_victims_cards_free(build, kit, sim, cluster):
    install_classes(cluster)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    batch = make_pod(cluster, "batch", "batch")
    other = make_pod(cluster, "other", "standard")
    urgent = make_pod(cluster, "urgent", "urgent")
    # More pods refused before the nominee than one nudge round takes (16), twice over.
    queue = [make_pod(cluster, f"wait-{i:02d}") for i in range(40)]
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, batch, kit)
        await hold(client, cluster, other, kit)
        for pod in queue:
            assert (await client.post("/v1/allocations", json=kit.ask(pod))).status_code == 409
        assert (await client.post("/v1/allocations", json=kit.ask(urgent))).status_code == 409
        assert nomination(cluster, "gpu-a")["pod"]["uid"] == urgent.uid
        # Capacity elsewhere while the victim still holds the nominee's server: the nominee
        # can book nothing, so it is not nudged (it would only cost kube-scheduler a cycle).
        finish(cluster, other)
        await nudge_seen(kit, cluster, queue[0], after=None, what="the round for gpu-b")
        assert retry_stamp(cluster, urgent) is None
        assert (await client.post("/v1/allocations", json=kit.ask(urgent))).status_code == 409
        finish(cluster, batch)
        await nudge_seen(kit, cluster, urgent, after=None, what="the nominee nudged")


def retry_stamp(cluster, pod: PodRef) -> str | None:
    return cluster.annotations(pod).get(ANNOTATION_RETRY_AT)


async def nudge_seen(kit, cluster, pod: PodRef, *, after: str | None, what: str) -> None:
    async def changed() -> bool:
        return retry_stamp(cluster, pod) not in (None, after)

    await kit.wait_for(changed, what=what)


async def settled_stamp(cluster, pod: PodRef) -> str | None:
    """The pod's nudge stamp once the rounds for the last capacity event are over (none for
    longer than the cool-down and its retry)."""
    stamp = retry_stamp(cluster, pod)
    while True:
        await anyio.sleep(COOL_DOWN * 1.5)
        if retry_stamp(cluster, pod) == stamp:
            return stamp
        stamp = retry_stamp(cluster, pod)


async def test_pods_kept_off_a_promised_server_are_nudged_when_its_nominee_goes_away(
    build, kit, sim, cluster
):
    discovery, batch, urgent, standard = one_server_three_classes(build, kit, cluster)
    async with allocator(kit, sim, discovery) as client:
        await hold(client, cluster, batch, kit)
        await preempted_and_freed(client, kit, cluster, batch, urgent)
        refused = await client.post("/v1/allocations", json=kit.ask(standard))
        assert refused.status_code == 409
        await nudge_seen(kit, cluster, standard, after=None, what="the round for the freed server")
        stamp = await settled_stamp(cluster, standard)
        # No claim changes from here on: only the nominee leaving frees the server.
        finish(cluster, urgent)
        await nudge_seen(kit, cluster, standard, after=stamp, what="a nudge once the nominee left")
        assert (await client.post("/v1/allocations", json=kit.ask(standard))).status_code == 200


async def test_pods_kept_off_a_promised_server_are_nudged_when_the_nomination_expires(
    build, kit, sim, cluster
):
    discovery, batch, urgent, standard = one_server_three_classes(build, kit, cluster)
    env = {"RGPU_BOOKING_TTL_SECONDS": "3"}
    async with allocator(kit, sim, discovery, **env) as client:
        await hold(client, cluster, batch, kit)
        await preempted_and_freed(client, kit, cluster, batch, urgent)
        expires = nomination(cluster, "gpu-a")["expiresAt"]
        refused = await client.post("/v1/allocations", json=kit.ask(standard))
        assert refused.status_code == 409
        await nudge_seen(kit, cluster, standard, after=None, what="the round for the freed server")
        # The rounds for the victim's release are over long before; the nominee never comes
        # back for its server, so only the expiry frees it.
        await anyio.sleep(max(0.0, expires - time.time() - 0.5))
        stamp = retry_stamp(cluster, standard)
        await nudge_seen(kit, cluster, standard, after=stamp, what="a nudge at the expiry")
        assert time.time() >= expires
        assert (await client.post("/v1/allocations", json=kit.ask(standard))).status_code == 200


async def test_a_nominee_refused_by_another_replica_is_nudged_before_the_leaders_own_refusals(
    build, kit, sim, cluster
):
    discovery, batch, urgent = one_server_batch_and_urgent(build, kit, cluster)
    queue = [make_pod(cluster, f"wait-{i:02d}") for i in range(40)]
    async with (
        allocator(kit, sim, discovery) as leader,
        allocator(kit, sim, discovery) as follower,
    ):
        await hold(leader, cluster, batch, kit)
        # The leader refuses more pods than a round takes; the follower nominates the urgent pod.
        for pod in queue:
            assert (await leader.post("/v1/allocations", json=kit.ask(pod))).status_code == 409
        assert (await follower.post("/v1/allocations", json=kit.ask(urgent))).status_code == 409
        assert nomination(cluster, "gpu-a")["pod"]["uid"] == urgent.uid
        before = retry_stamp(cluster, urgent)
        finish(cluster, batch)
        await nudge_seen(kit, cluster, urgent, after=before, what="the nominee nudged")
        nudged_queue = sum(1 for pod in queue if retry_stamp(cluster, pod) is not None)
        assert nudged_queue < len(queue)
