"""``GET /v1/fleet?delta=1``: a follower holding revision R gets only the servers changed or
removed since R, and applying them gives exactly the fleet a full read gives; R older than
the changelog gets the whole fleet marked full; R above this replica's revision gets
``behind`` after the wait, never an older fleet; clients that do not opt in get today's
body."""

from __future__ import annotations

import random

import anyio
import httpx
import pytest

from rgpu_contracts import Fleet, FleetUpdate, UpdateKind
from rgpu_runtime.feeds import CHANGELOG_LIMIT, FLEET_FEED, Follower, FollowPolicy, Mirror
from rgpu_runtime.peers import http_client
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio


async def update(discovery, since: int | None, wait: float = 0.0) -> FleetUpdate:
    params = {"delta": "1"} if since is None else {"delta": "1", "since": since, "wait": wait}
    response = await discovery.client.get("/v1/fleet", params=params)
    assert response.status_code == 200
    return FleetUpdate.from_dict(response.json())


def server_node(build, name: str, *, rack: str = "r1", ready: str = "True", cards: int = 1):
    annotation = build.register(*(build.card(f"GPU-{name}-{i}", index=i) for i in range(cards)))
    return build.node(name, ip=None, ready=ready, annotation=annotation, labels={build.rack: rack})


def change(sim, build, rng: random.Random, present: set[str], step: int) -> None:
    """One random change of the server Nodes: add, delete, or relabel (always a new rack)
    with a random readiness and card count."""
    name = f"gpu-{rng.randrange(12):02d}"
    if name not in present:
        sim.store.create("nodes", server_node(build, name, rack=f"r{rng.randrange(3)}"))
        present.add(name)
    elif rng.random() < 0.25:
        sim.store.delete("nodes", name)
        present.discard(name)
    else:
        node = server_node(
            build,
            name,
            rack=f"step-{step}",
            ready=rng.choice(["True", "False"]),
            cards=rng.randrange(1, 4),
        )
        sim.store.patch("nodes", name, {"metadata": node["metadata"]})


async def test_applying_updates_after_random_changes_equals_the_full_fleet(
    sim, start, build
) -> None:
    rng = random.Random(15)
    present: set[str] = set()
    async with start() as discovery:
        first = await update(discovery, None)
        assert first.kind is UpdateKind.FULL
        held = first.apply(None)
        for step in range(40):
            before = await discovery.fleet()
            change(sim, build, rng, present, step)
            full = await discovery.fleet_when(lambda f, r=before.revision: f.revision > r)
            if step % 3 == 2:
                continue  # the next update then spans several revisions
            answer = await update(discovery, held.revision)
            assert answer.kind is UpdateKind.DELTA
            assert len(answer.servers) + len(answer.removed) <= 3
            held = answer.apply(held)
            assert held == full
        full = await discovery.fleet()
        held = (await update(discovery, held.revision)).apply(held)
    assert held == full
    assert {server.name for server in full.servers} == present


async def test_an_unchanged_server_is_not_sent_again(sim, start, build) -> None:
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        sim.store.create("nodes", server_node(build, name))
    async with start() as discovery:
        held = await discovery.fleet_when(lambda f: len(f.servers) == 3)
        sim.store.patch("nodes", "gpu-b", {"metadata": {"labels": {build.rack: "r9"}}})
        answer = await update(discovery, held.revision, wait=5)
    assert (answer.kind, [s.name for s in answer.servers], answer.removed) == (
        UpdateKind.DELTA,
        ["gpu-b"],
        (),
    )
    assert answer.since == held.revision


async def test_a_revision_older_than_the_changelog_gets_the_whole_fleet_marked_full(
    sim, start, build
) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a"))
    async with start() as discovery:
        first = await discovery.fleet_when(lambda f: len(f.servers) == 1)
        for step in range(CHANGELOG_LIMIT + 1):
            rack = f"step-{step}"
            sim.store.patch("nodes", "gpu-a", {"metadata": {"labels": {build.rack: rack}}})
            full = await discovery.fleet_when(
                lambda f, r=rack: bool(f.servers) and f.servers[0].label(build.rack) == r
            )
        answer = await update(discovery, first.revision, wait=5)
        body = (await discovery.client.get("/v1/fleet", params={"delta": "1"})).json()
    assert answer.kind is UpdateKind.FULL
    assert answer.apply(None) == full
    assert body == {"kind": "full", **full.to_dict()}


async def test_a_revision_above_this_replica_is_answered_behind_after_the_wait(start) -> None:
    async with start() as discovery:
        fleet = await discovery.fleet()
        answer = await update(discovery, fleet.revision + 10, wait=0.2)
    assert (answer.kind, answer.revision, answer.since) == (
        UpdateKind.BEHIND,
        fleet.revision,
        fleet.revision + 10,
    )
    assert answer.servers == ()


async def test_a_client_without_the_opt_in_gets_todays_body(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a"))
    async with start() as discovery:
        full = await discovery.fleet_when(lambda f: len(f.servers) == 1)
        sim.store.create("nodes", server_node(build, "gpu-b"))
        response = await discovery.client.get(
            "/v1/fleet", params={"since": full.revision, "wait": 5}
        )
    body = response.json()
    assert set(body) == {"revision", "observedAt", "servers"}
    assert [server["name"] for server in body["servers"]] == ["gpu-a", "gpu-b"]
    assert Fleet.from_dict(body).revision > full.revision


@pytest.mark.parametrize("query", [{"delta": "yes"}, {"delta": "1", "since": "-3"}])
async def test_a_bad_delta_or_since_is_a_400_naming_it(start, query: dict[str, str]) -> None:
    async with start() as discovery:
        response = await discovery.client.get("/v1/fleet", params=query)
    assert response.status_code == 400
    name = "delta" if query["delta"] == "yes" else "since"
    assert f"query parameter {name!r}" in response.json()["message"]


class Switching(httpx.AsyncBaseTransport):
    """Sends each request to the next replica in turn, as a Service may."""

    def __init__(self, replicas) -> None:
        self.replicas = replicas
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        replica = self.replicas[self.calls % len(self.replicas)]
        self.calls += 1
        answer = await replica.client.get(request.url.path, params=request.url.params)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


async def test_a_follower_switched_between_replicas_never_goes_back_and_ends_equal(
    sim, start, build
) -> None:
    rng = random.Random(19)
    present: set[str] = set()
    taken: list[Fleet] = []
    policy = FollowPolicy(wait_seconds=0.3, min_interval_seconds=0.01)
    async with (
        start() as a,
        start() as b,
        http_client(base_url="http://discovery", timeout=5.0, transport=Switching([a, b])) as http,
        anyio.create_task_group() as tg,
    ):
        mirror = Mirror(FLEET_FEED, name="discovery", on_change=taken.append)
        follower = Follower(http, mirror, policy=policy)
        await tg.start(follower.run)
        for step in range(12):
            change(sim, build, rng, present, step)
            await anyio.sleep(0.05)
        names = {f"gpu-{i:02d}" for i in range(12)} & present
        ends = [await r.fleet_when(lambda f: {s.name for s in f.servers} == names) for r in (a, b)]
        await eventually(lambda: taken and taken[-1].servers == ends[0].servers)
        tg.cancel_scope.cancel()
    revisions = [fleet.revision for fleet in taken]
    assert revisions == sorted(set(revisions))
    assert ends[0].servers == ends[1].servers
