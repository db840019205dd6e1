"""``GET /v1/claims`` across replicas: the claim set's revision is the Lease watch's
resourceVersion, so two replicas mean the same by it; a follower switched between them on
every call never sees a revision go backwards and ends equal to the full claim set;
``delta=1`` answers only the servers changed since the revision held."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import httpx
import pytest

from rgpu_contracts import ClaimSet, ClaimsUpdate, UpdateKind
from rgpu_runtime.feeds import CLAIMS_FEED, Follower, FollowPolicy, Mirror
from rgpu_runtime.peers import http_client

pytestmark = pytest.mark.anyio

POLICY = FollowPolicy(wait_seconds=2.0, margin_seconds=5.0, min_interval_seconds=0.01)


class Switching(httpx.AsyncBaseTransport):
    """Sends each request to the next replica in turn, as a Service may."""

    def __init__(self, replicas: Sequence[httpx.AsyncClient]) -> None:
        self.replicas = replicas
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        replica = self.replicas[self.calls % len(self.replicas)]
        self.calls += 1
        answer = await replica.get(request.url.path, params=request.url.params)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


async def claim_set(client: httpx.AsyncClient) -> ClaimSet:
    return ClaimSet.from_dict((await client.get("/v1/claims")).json())


async def settled(a: httpx.AsyncClient, b: httpx.AsyncClient, revision: int) -> ClaimSet:
    """The claim set once both replicas are at the same revision, at least ``revision``."""
    with anyio.fail_after(5):
        while True:
            first, second = await claim_set(a), await claim_set(b)
            if first == second and first.revision >= revision:
                return first
            await anyio.sleep(0.02)


async def test_a_follower_switched_between_replicas_never_goes_back_and_ends_equal(
    build, kit, sim, cluster
) -> None:
    servers = [build.server(f"gpu-{i}", cards=1) for i in range(6)]
    discovery = kit.FakeDiscovery(build.fleet(*servers))
    pods = [cluster.pod(f"p{i}") for i in range(6)]
    taken: list[ClaimSet] = []
    async with (
        kit.running_allocator(sim.url, discovery) as a,
        kit.running_allocator(sim.url, discovery) as b,
        http_client(base_url="http://allocator", timeout=5.0, transport=Switching([a, b])) as http,
        anyio.create_task_group() as tg,
    ):
        mirror = Mirror(CLAIMS_FEED, name="allocator", on_change=taken.append)
        follower = Follower(http, mirror, policy=POLICY)
        await tg.start(follower.run)
        for i, pod in enumerate(pods):
            booked = await (a, b)[i % 2].post("/v1/allocations", json=kit.ask(pod))
            assert booked.status_code == 200, booked.text
            if i % 3 == 2:
                assert (await (b, a)[i % 2].delete(f"/v1/allocations/{pods[i - 1].uid}")).is_success
        final = await settled(a, b, 0)
        await kit.wait_for(lambda: follower.status.revision == final.revision)
        tg.cancel_scope.cancel()
    revisions = [claims.revision for claims in taken]
    assert revisions == sorted(set(revisions))
    assert taken[-1] == final
    assert {c.pod.name for c in final.claims} == {"p0", "p2", "p3", "p5"}


async def test_replicas_at_the_same_watch_position_answer_the_same_revision_and_body(
    build, kit, sim, cluster
) -> None:
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    async with (
        kit.running_allocator(sim.url, discovery) as a,
        kit.running_allocator(sim.url, discovery) as b,
    ):
        await a.post("/v1/allocations", json=kit.ask(cluster.pod("p")))
        lease = cluster.lease(
            ClaimSet.from_dict((await a.get("/v1/allocations/x")).json()) if False else "gpu-a"
        )
        final = await settled(a, b, 1)
        bodies = [(await replica.get("/v1/claims")).content for replica in (a, b)]
    assert bodies[0] == bodies[1]
    assert final.revision == int(lease["metadata"]["resourceVersion"])


async def test_an_update_carries_only_the_servers_changed_since(build, kit, sim, cluster) -> None:
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a"), build.server("gpu-b")))
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(cluster.pod("p")))
        held = await settled(client, client, 1)
        await client.post("/v1/allocations", json=kit.ask(cluster.pod("q")))
        raw = await client.get(
            "/v1/claims", params={"since": held.revision, "wait": 5, "delta": "1"}
        )
        full = await claim_set(client)
    update = ClaimsUpdate.from_dict(raw.json())
    assert update.kind is UpdateKind.DELTA
    assert [c.pod.name for c in update.claims] == ["q"]
    assert len(update.servers) == 1
    assert update.apply(held) == full
    assert raw.headers["X-Rgpu-Revision"] == str(full.revision)


async def test_a_revision_ahead_gets_behind_and_an_old_one_the_full_set(
    build, kit, sim, cluster
) -> None:
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with kit.running_allocator(sim.url, discovery) as client:
        await client.post("/v1/allocations", json=kit.ask(cluster.pod("p")))
        held = await settled(client, client, 1)
        ahead = await client.get(
            "/v1/claims", params={"since": held.revision + 5, "wait": 0.1, "delta": "1"}
        )
        old = await client.get("/v1/claims", params={"since": 0, "wait": 1, "delta": "1"})
        plain = await client.get("/v1/claims", params={"since": 0, "wait": 1})
        bad = await client.get("/v1/claims", params={"since": 1, "delta": "maybe"})
    assert ahead.json() == {"kind": "behind", "revision": held.revision, "since": held.revision + 5}
    assert old.json() == {"kind": "full", **held.to_dict()}
    assert plain.json() == held.to_dict()
    assert bad.status_code == 400
    assert "query parameter 'delta'" in bad.json()["message"]
