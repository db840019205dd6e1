"""Real ``python -m rgpu_allocator`` processes against one kubesim and one fake discovery on
loopback: replicas racing, and a replica killed between booking and commit."""

from __future__ import annotations

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
