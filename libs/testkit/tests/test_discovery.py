from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from rgpu_contracts import Fleet, Server, Topology
from rgpu_testkit import FakeDiscovery, fleet, server, topology

pytestmark = pytest.mark.anyio


@pytest.fixture
def discovery() -> FakeDiscovery:
    return FakeDiscovery(fleet(servers=[server(name="gpu-a")]), topology(nodes={"c1": {}}))


@pytest.fixture
async def http(discovery: FakeDiscovery) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=discovery.transport, base_url="http://d") as client:
        yield client


async def test_serves_the_fleet_and_topology_contracts_with_their_revision(
    discovery: FakeDiscovery, http: httpx.AsyncClient
) -> None:
    got = await http.get("/v1/fleet")
    assert Fleet.from_dict(got.json()) == discovery.fleet
    assert got.headers["x-rgpu-revision"] == "1"
    assert Topology.from_dict((await http.get("/v1/topology")).json()) == discovery.topology
    assert discovery.polls == 2


async def test_a_held_poll_answers_when_a_newer_fleet_is_published(
    discovery: FakeDiscovery, http: httpx.AsyncClient
) -> None:
    answers: list[Fleet] = []

    async def poll() -> None:
        got = await http.get("/v1/fleet", params={"since": "1", "wait": "30"})
        answers.append(Fleet.from_dict(got.json()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(poll)
        await anyio.wait_all_tasks_blocked()
        discovery.publish_fleet(fleet(servers=[server(name="gpu-b")], revision=7))
    assert [a.revision for a in answers] == [7]
    assert answers[0].server("gpu-b") is not None


async def test_publish_servers_serves_them_as_the_next_revision(
    discovery: FakeDiscovery, http: httpx.AsyncClient
) -> None:
    discovery.publish(server(name="gpu-a", busy=[0]), topology=topology(revision=9))
    got = Fleet.from_dict((await http.get("/v1/fleet", params={"since": "1", "wait": "5"})).json())
    assert got.revision == 2
    assert got.servers[0].busy
    assert discovery.topology.revision == 2


async def test_a_held_poll_without_change_answers_unchanged_after_wait(
    http: httpx.AsyncClient,
) -> None:
    got = await http.get("/v1/fleet", params={"since": "1", "wait": "0.01"})
    assert got.json()["revision"] == 1


async def test_publishing_an_older_revision_is_refused(discovery: FakeDiscovery) -> None:
    with pytest.raises(ValueError, match="not newer"):
        discovery.publish_fleet(fleet(revision=1))


async def test_bad_poll_parameters_are_a_400_naming_them(http: httpx.AsyncClient) -> None:
    got = await http.get("/v1/fleet", params={"wait": "5"})
    assert got.status_code == 400
    assert "wait" in got.json()["message"]


async def test_unavailable_discovery_answers_a_retryable_503(
    discovery: FakeDiscovery, http: httpx.AsyncClient
) -> None:
    discovery.available = False
    got = await http.get("/v1/topology")
    assert got.status_code == 503
    assert got.json()["retryable"] is True
    assert "not listed yet" in got.json()["message"]


async def test_probe_answers_the_probed_server_else_the_published_one(
    discovery: FakeDiscovery, http: httpx.AsyncClient
) -> None:
    assert Server.from_dict((await http.post("/v1/servers/gpu-a/probe")).json()).busy == set()
    discovery.probed["gpu-a"] = server(name="gpu-a", busy=[1])
    assert Server.from_dict((await http.post("/v1/servers/gpu-a/probe")).json()).busy
    assert (await http.post("/v1/servers/nope/probe")).status_code == 404
    discovery.probe_status = 409
    assert (await http.post("/v1/servers/gpu-a/probe")).status_code == 409
    assert discovery.probes == ["gpu-a", "gpu-a", "nope", "gpu-a"]


async def test_handler_answers_through_a_mock_transport(discovery: FakeDiscovery) -> None:
    transport = httpx.MockTransport(discovery.handler)
    async with httpx.AsyncClient(transport=transport, base_url="http://d") as client:
        assert (await client.get("/v1/fleet")).json()["revision"] == 1


async def test_serving_on_loopback_releases_held_polls_on_exit(discovery: FakeDiscovery) -> None:
    answered: list[int] = []
    async with discovery.serving() as url:
        assert url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=url) as client, anyio.create_task_group() as tg:

            async def poll() -> None:
                got = await client.get("/v1/fleet", params={"since": "1", "wait": "60"})
                answered.append(got.status_code)

            tg.start_soon(poll)
            await anyio.sleep(0.1)
            discovery.release()
    assert answered == [200]
