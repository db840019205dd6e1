"""Following discovery's fleet and topology into one index, as the allocator and the extender
both do: through outages, never re-taking an unchanged revision, with ages and errors that say
how fresh the index is."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import anyio
import httpx
import orjson
import pytest
from anyio.abc import TaskGroup

import rgpu_testkit as kit
from rgpu_contracts import Fleet, Topology
from rgpu_runtime.errors import Unavailable, UpstreamError
from rgpu_runtime.feeds import DiscoveryMirror, Follower, FollowPolicy
from rgpu_runtime.peers import http_client
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

RACK = "topology.rgpu.io/rack"
KEYS = (RACK,)
Handler = Callable[[httpx.Request], httpx.Response]


@dataclasses.dataclass(frozen=True)
class Index:
    """The index a service builds (``rgpu_placement.FleetView`` in production)."""

    fleet: Fleet
    topology: Topology | None
    keys: tuple[str, ...]
    built: int = 1

    @classmethod
    def build(cls, fleet: Fleet, topology: Topology | None, keys: Sequence[str]) -> Index:
        return cls(fleet=fleet, topology=topology, keys=tuple(keys))

    def with_fleet(self, fleet: Fleet) -> Index:
        return dataclasses.replace(self, fleet=fleet, built=self.built + 1)

    def with_topology(self, topology: Topology) -> Index:
        return dataclasses.replace(self, topology=topology, built=self.built + 1)

    def names(self) -> set[str]:
        return {server.name for server in self.fleet.servers}


def fake_discovery() -> kit.FakeDiscovery:
    fleet = kit.fleet(servers=(kit.server(name="gpu-node-2"), kit.server(name="lupine-b")))
    topology = kit.topology(nodes={"cpu-node-1": {RACK: "r2"}, "cpu-node-2": {RACK: "r7"}})
    return kit.FakeDiscovery(fleet, topology)


@pytest.fixture
def discovery() -> kit.FakeDiscovery:
    return fake_discovery()


@pytest.fixture
async def http(discovery: kit.FakeDiscovery) -> AsyncIterator[httpx.AsyncClient]:
    transport = discovery.transport
    async with http_client(base_url="http://discovery", timeout=1, transport=transport) as client:
        yield client


@pytest.fixture
def mirrored() -> DiscoveryMirror[Index]:
    return DiscoveryMirror(Index.build, topology_keys=KEYS)


@asynccontextmanager
async def running(*followers: Follower[Fleet] | Follower[Topology]) -> AsyncIterator[TaskGroup]:
    """A task group running ``followers``, each started (answered once) in turn."""
    async with anyio.create_task_group() as tg:
        for follower in followers:
            await tg.start(follower.run)
        yield tg
        tg.cancel_scope.cancel()


async def test_first_fleet_and_topology_are_there_once_started(http, mirrored) -> None:
    fleet, topology = mirrored.followers(http)
    async with running(topology, fleet):
        view = mirrored.view
    assert view is not None
    assert view.names() == {"gpu-node-2", "lupine-b"}
    assert view.topology is not None
    assert view.topology.labels_of()["cpu-node-1"][RACK] == "r2"
    assert view.keys == KEYS


async def test_a_topology_after_the_first_fleet_updates_the_index(
    http, discovery, mirrored
) -> None:
    fleet, topology = mirrored.followers(http)
    async with running(fleet) as tg:
        assert mirrored.view is not None
        assert mirrored.view.topology is None
        await tg.start(topology.run)
        assert mirrored.view.topology == discovery.topology
        assert mirrored.view.fleet is mirrored.fleet.value


async def test_a_published_change_arrives_without_waiting_out_the_poll(
    http, discovery, mirrored
) -> None:
    async with running(mirrored.followers(http)[0]):
        discovery.publish_fleet(kit.fleet(servers=(kit.server(name="new-server"),), revision=5))
        await eventually(lambda: mirrored.view and "new-server" in mirrored.view.names())
    assert mirrored.view is not None
    assert mirrored.fleet.latest.value is mirrored.view.fleet


async def test_every_fleet_taken_is_told_with_the_index_before_and_after(
    http, discovery, mirrored
) -> None:
    told: list[tuple[Index | None, Index]] = []
    mirrored.on_fleet(lambda old, new: told.append((old, new)))
    async with running(mirrored.followers(http)[0]):
        discovery.publish_fleet(kit.fleet(servers=(kit.server(name="new-server"),), revision=5))
        await eventually(lambda: len(told) == 2)
    (none, first), (old, new) = told
    assert (none, old, new.built) == (None, first, 2)
    assert new is mirrored.view


async def test_an_outage_at_start_leaves_no_fleet_then_recovers(http, discovery, mirrored) -> None:
    discovery.available = False
    policy = FollowPolicy(backoff_initial_seconds=0.01, backoff_cap_seconds=0.05)
    fleet, _ = mirrored.followers(http, policy=policy)
    async with running() as tg:
        tg.start_soon(fleet.run)
        await eventually(lambda: fleet.status.failures >= 2)
        assert mirrored.view is None
        assert "not listed yet" in fleet.status.last_error
        assert mirrored.error is not None
        assert "not listed yet" in mirrored.error
        discovery.available = True
        await eventually(lambda: mirrored.view is not None)
        assert mirrored.error is None


async def test_an_unchanged_revision_is_not_republished(http, discovery, mirrored) -> None:
    async with running(mirrored.followers(http)[0]):
        revision = mirrored.fleet.latest.revision
        discovery.fleets.publish(discovery.fleets.value)
        await eventually(lambda: discovery.polls >= 3)
        assert mirrored.fleet.latest.revision == revision


async def test_asked_once_returns_after_a_failed_first_call_too(http, discovery, mirrored) -> None:
    discovery.available = False
    async with running() as tg:
        for follower in mirrored.followers(http):
            tg.start_soon(follower.run)
        with anyio.fail_after(2):
            await mirrored.asked_once()
        assert mirrored.view is None
        assert mirrored.topology.value is None


@asynccontextmanager
async def followers_over(
    handler: Handler,
) -> AsyncIterator[tuple[Follower[Fleet], Follower[Topology]]]:
    transport = httpx.MockTransport(handler)
    async with http_client(base_url="http://discovery", timeout=1, transport=transport) as http:
        yield DiscoveryMirror(Index.build, topology_keys=KEYS).followers(http)


def answering(step: tuple[int, object] | Exception) -> Handler:
    """Every call answered ``(status, body)``, or failing with the exception."""

    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(step, Exception):
            raise step
        return httpx.Response(step[0], content=orjson.dumps(step[1]))

    return handler


async def test_discovery_polls_carry_since_and_wait() -> None:
    fleet = kit.fleet(servers=(kit.server(name="a"),), revision=4)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=orjson.dumps(fleet.to_dict()))

    async with followers_over(handler) as (follower, _):
        assert await follower.poll_once()
        assert follower.latest.value == fleet
        await follower.poll_once()
    assert dict(seen[0].url.params) == {"delta": "1"}
    assert dict(seen[1].url.params) == {"since": "4", "wait": "30", "delta": "1"}


async def test_discovery_failures_are_typed() -> None:
    not_listed = (503, {"code": "u", "message": "not listed"})
    async with followers_over(answering(not_listed)) as (_, topology):
        with pytest.raises(Unavailable, match="not listed"):
            await topology.poll_once()
    async with followers_over(answering((200, {"revision": "x"}))) as (fleet, _):
        with pytest.raises(UpstreamError, match="revision"):
            await fleet.poll_once()
    async with followers_over(answering(httpx.ConnectError("refused"))) as (fleet, _):
        with pytest.raises(Unavailable, match="refused"):
            await fleet.poll_once()


async def test_fleet_age_is_zero_while_polled_and_counts_from_the_last_answer_after() -> None:
    now = [100.0]
    fleet = kit.fleet(servers=(kit.server(name="a"),))
    failing = anyio.Event()
    calls: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(200, content=orjson.dumps(fleet.to_dict()))
        await failing.wait()
        return httpx.Response(503, content=orjson.dumps({"code": "u", "message": "down"}))

    mirrored = DiscoveryMirror(Index.build, topology_keys=KEYS, clock=lambda: now[0])
    transport = httpx.MockTransport(handler)
    async with (
        http_client(base_url="http://discovery", timeout=1, transport=transport) as http,
        anyio.create_task_group() as tg,
    ):
        follower, _ = mirrored.followers(http)
        assert mirrored.fleet_age() is None
        await tg.start(follower.run)
        now[0] = 130.0
        assert mirrored.fleet_age() == 0.0
        failing.set()
        await eventually(lambda: follower.status.failures >= 1)
        now[0] = 133.0
        assert mirrored.fleet_age() == 33.0
        tg.cancel_scope.cancel()


async def test_each_streams_age_is_infinite_until_discovery_answers_it(http) -> None:
    now = [50.0]
    mirrored = DiscoveryMirror(Index.build, topology_keys=KEYS, clock=lambda: now[0])
    fleet, _ = mirrored.followers(http)
    assert mirrored.age("fleet") == mirrored.age("topology") == float("inf")
    await fleet.poll_once()
    now[0] = 52.5
    assert (mirrored.age("fleet"), mirrored.age("topology")) == (2.5, float("inf"))
