"""Real ``python -m rgpu_allocator`` processes against one kubesim and one fake discovery on
loopback: replicas racing, and a replica killed between booking and commit."""

from __future__ import annotations

import random
from collections import defaultdict

import anyio
import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.process]

SERVERS = 40
REQUESTS = 400


async def test_two_processes_and_400_concurrent_requests_never_double_book(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(
        build.fleet(*(build.server(f"gpu-{i:02}") for i in range(SERVERS)))
    )
    pods = [cluster.pod(f"p-{i:03}") for i in range(REQUESTS)]
    async with kit.discovery_server(discovery) as url:
        env = kit.allocator_env(sim.url, RGPU_DISCOVERY_URL=url)
        async with kit.allocator_process(env) as one, kit.allocator_process(env) as two:
            replicas = (one.client, two.client)
            answers: dict[str, tuple[int, dict]] = {}

            async def post(i: int) -> None:
                reply = await replicas[i % 2].post("/v1/allocations", json=kit.ask(pods[i]))
                answers[pods[i].name] = (reply.status_code, reply.json())

            async with anyio.create_task_group() as tg:
                for i in range(REQUESTS):
                    tg.start_soon(post, i)

    statuses = defaultdict(int)
    per_server: dict[str, set[str]] = defaultdict(set)
    for name, (status, body) in answers.items():
        statuses[status] += 1
        if status == 200:
            per_server[body["server"]].add(name)
    assert statuses[200] == SERVERS, dict(statuses)
    errors = {body.get("message") for status, body in answers.values() if status >= 500}
    assert statuses[200] + statuses[409] == REQUESTS, (dict(statuses), errors)
    assert all(len(names) == 1 for names in per_server.values()), per_server
    assert len(per_server) == SERVERS
    stored = cluster.holders()
    assert all(len(names) == 1 for names in stored.values()), stored
    assert {s: names[0] for s, names in stored.items()} == {
        s: next(iter(names)) for s, names in per_server.items()
    }


async def test_booking_survives_kill_9_and_is_committed_by_a_new_allocator(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    pod = cluster.pod("trainer")
    async with kit.discovery_server(discovery) as url:
        env = kit.allocator_env(sim.url, RGPU_DISCOVERY_URL=url)
        async with kit.allocator_process(env) as doomed:
            booked = (await doomed.client.post("/v1/allocations", json=kit.ask(pod))).json()
            doomed.process.kill()
            await doomed.process.wait()
    async with kit.running_allocator(sim.url, discovery) as client:
        again = (await client.post("/v1/allocations", json=kit.ask(pod))).json()
        other = (await client.post("/v1/allocations", json=kit.ask(cluster.pod("other")))).json()
        commit = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "c1"})
    assert again["server"] == booked["server"]
    assert again["bookedAt"] == booked["bookedAt"]
    assert other["server"] != booked["server"]
    assert commit.status_code == 200
    assert commit.json()["server"] == booked["server"]


async def test_booking_of_a_killed_allocator_still_expires(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    pod, waiter = cluster.pod("abandoned"), cluster.pod("waiter")
    ttl = {"RGPU_BOOKING_TTL_SECONDS": "1.5"}
    async with kit.discovery_server(discovery) as url:
        env = kit.allocator_env(sim.url, RGPU_DISCOVERY_URL=url, **ttl)
        async with kit.allocator_process(env) as doomed:
            booked = await doomed.client.post("/v1/allocations", json=kit.ask(pod))
            doomed.process.kill()
            await doomed.process.wait()
    assert booked.status_code == 200
    async with kit.running_allocator(sim.url, discovery, **ttl) as client:
        held = await client.post("/v1/allocations", json=kit.ask(waiter))
        assert held.status_code == 409

        async def expired() -> bool:
            return cluster.holders().get("gpu-a") == []

        await kit.wait_for(expired)
        got = await client.post("/v1/allocations", json=kit.ask(waiter))
    assert got.status_code == 200


RACE_ROUNDS = 6
RACE_TTL = 1.0


async def race_round(kit, cluster, replicas, rng: random.Random, round_: int) -> list[str]:
    """Book three pods, wait about the TTL, then commit and bind them on either replica while
    three more pods ask for the same servers; returns the committed pods whose claim is gone."""
    first = [cluster.pod(f"r{round_}-a{i}") for i in range(3)]
    then = [cluster.pod(f"r{round_}-b{i}") for i in range(3)]
    for i, pod in enumerate(first):
        await replicas[i % 2].post("/v1/allocations", json=kit.ask(pod))
    await anyio.sleep(RACE_TTL * rng.uniform(0.95, 1.02))
    committed: dict[str, str] = {}

    async def commit(pod) -> None:
        url = f"/v1/allocations/{pod.uid}/commit"
        answer = await rng.choice(replicas).post(url, json={"node": "client-1"})
        if answer.status_code == 200:
            cluster.bind(pod)
            committed[pod.name] = answer.json()["server"]

    async def book(pod) -> None:
        await rng.choice(replicas).post("/v1/allocations", json=kit.ask(pod))

    async with anyio.create_task_group() as tg:
        for a, b in zip(first, then, strict=True):
            tg.start_soon(commit, a)
            tg.start_soon(book, b)
    # Both replicas sweep (every TTL / 3) and re-validate in this time.
    await anyio.sleep(RACE_TTL / 2)
    stored = cluster.holders()
    assert all(len(names) <= 1 for names in stored.values()), stored
    for pod in (*first, *then):
        cluster.delete(pod)
    return [name for name, server in committed.items() if stored.get(server) != [name]]


async def test_commits_landing_as_their_bookings_expire_are_never_lost_across_two_processes(
    build, kit, sim, cluster
):
    """docs/design.md §10, the issue's soak in small: refusals re-validate expiring bookings and
    both replicas sweep while the commits of those bookings land."""
    discovery = kit.FakeDiscovery(build.fleet(*(build.server(f"gpu-{i}") for i in range(3))))
    rng = random.Random(14)
    lost: list[str] = []

    async def empty() -> bool:
        return not any(cluster.holders().values())

    async with kit.discovery_server(discovery) as url:
        env = kit.allocator_env(sim.url, RGPU_DISCOVERY_URL=url, RGPU_BOOKING_TTL_SECONDS="1")
        async with kit.allocator_process(env) as one, kit.allocator_process(env) as two:
            for round_ in range(RACE_ROUNDS):
                lost += await race_round(kit, cluster, (one.client, two.client), rng, round_)
                await kit.wait_for(empty)
    assert lost == []


async def test_a_leader_killed_mid_burst_loses_no_admission_and_books_nothing_twice(
    build, kit, sim, cluster
):
    import importlib

    admission = importlib.import_module("services.allocator.tests.test_admission")
    count = 60
    discovery = kit.FakeDiscovery(build.fleet(*(build.server(f"gpu-{i:02}") for i in range(count))))
    async with kit.discovery_server(discovery) as url:
        env = kit.allocator_env(sim.url, RGPU_DISCOVERY_URL=url, RGPU_ADMISSION_CONCURRENCY="2")
        async with kit.allocator_process(env) as one, kit.allocator_process(env) as two:
            pods = [admission.gated_pod(cluster, f"burst-{i:02}") for i in range(count)]

            def admitted() -> int:
                return sum(not admission.gates(cluster, p) for p in pods)

            await kit.wait_for(lambda: admitted() >= 5, what="the first admissions")
            leading = [await admission.metric(r.client, "rgpu_leader") for r in (one, two)]
            leader = (one, two)[leading.index(1.0)]
            leader.process.kill()
            await leader.process.wait()
            assert admitted() < count
            await kit.wait_for(lambda: admitted() == count, what="every pod admitted", timeout=30)
    stored = {s: names for s, names in cluster.holders().items() if names}
    assert sorted(len(names) for names in stored.values()) == [1] * count
    assert sorted(n for names in stored.values() for n in names) == sorted(p.name for p in pods)


# A Lease to run out (15 s) and up to 60 s for the survivor's passes on a loaded machine.
@pytest.mark.timeout(120)
async def test_a_quota_holds_under_a_burst_and_across_a_leader_kill(build, kit, sim, cluster):
    import importlib

    admission = importlib.import_module("services.allocator.tests.test_admission")
    quota = 6
    body = {
        "metadata": {"name": "rgpu-queues"},
        "data": {"queues.yaml": f"default: {{cards: {quota}}}"},
    }
    cluster.sim.store.create("configmaps", body, namespace="rgpu-system")
    discovery = kit.FakeDiscovery(
        build.fleet(*(build.server(f"gpu-{i:02}", cards=1) for i in range(30)))
    )
    most = 0

    def held() -> int:
        return sum(len(names) for names in cluster.holders().values())

    async with kit.discovery_server(discovery) as url:
        env = kit.allocator_env(sim.url, RGPU_DISCOVERY_URL=url, RGPU_ADMISSION_CONCURRENCY="2")
        async with kit.allocator_process(env) as one, kit.allocator_process(env) as two:
            pods = [admission.gated_pod(cluster, f"burst-{i:02}") for i in range(30)]

            def admitted() -> int:
                return sum(not admission.gates(cluster, p) for p in pods)

            await kit.wait_for(lambda: admitted() >= 2, what="the first admissions")
            leading = [await admission.metric(r.client, "rgpu_leader") for r in (one, two)]
            leader = (one, two)[leading.index(1.0)]
            leader.process.kill()
            await leader.process.wait()
            # The survivor leads once the killed leader's Lease (15 s) has run out on its
            # clock; on a loaded two-core machine its first passes can take seconds more.
            with anyio.move_on_after(60):
                while admitted() < quota:
                    most = max(most, held())
                    await anyio.sleep(0.05)
            for _ in range(20):
                most = max(most, held())
                await anyio.sleep(0.05)
            survivor = one if leader is two else two
            leads = await admission.metric(survivor.client, "rgpu_leader")
            assert admitted() == quota, f"held {held()}, survivor leading {leads}"
    assert most == quota
