"""Following discovery's fleet and topology by long-poll, through outages."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from rgpu_extender.inventory import Inventory
from rgpu_runtime import FollowPolicy, http_client

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http(discovery) -> AsyncIterator[httpx.AsyncClient]:
    transport = discovery.transport
    async with http_client(base_url="http://discovery", timeout=1, transport=transport) as client:
        yield client


async def until(check) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(5):
        while not check():
            await anyio.sleep(0.01)


async def test_first_fleet_and_topology_are_there_once_started(http, discovery) -> None:
    inventory = Inventory()
    fleet, topology = inventory.followers(http)
    async with anyio.create_task_group() as tg:
        await tg.start(fleet.run)
        await tg.start(topology.run)
        assert inventory.fleet is not None
        assert set(inventory.fleet.servers) == {"gpu-node-2", "lupine-b"}
        assert inventory.topology is not None
        assert inventory.topology.labels["cpu-node-1"]["topology.rgpu.io/rack"] == "r2"
        tg.cancel_scope.cancel()


async def test_a_published_change_arrives_without_waiting_out_the_poll(
    http, discovery, make
) -> None:
    inventory = Inventory()
    fleet, _ = inventory.followers(http)
    async with anyio.create_task_group() as tg:
        await tg.start(fleet.run)
        discovery.publish_fleet(make.fleet(make.server("new-server"), revision=5))
        await until(lambda: inventory.fleet and "new-server" in inventory.fleet.servers)
        assert inventory.fleet_store.value is inventory.fleet
        tg.cancel_scope.cancel()


async def test_an_outage_at_start_leaves_no_fleet_then_recovers(http, discovery) -> None:
    discovery.available = False
    policy = FollowPolicy(backoff_initial_seconds=0.01, backoff_cap_seconds=0.05)
    inventory = Inventory(policy=policy)
    fleet, _ = inventory.followers(http)
    async with anyio.create_task_group() as tg:
        tg.start_soon(fleet.run)
        await until(lambda: fleet.status.failures >= 2)
        assert inventory.fleet is None
        assert "not listed yet" in fleet.status.last_error
        discovery.available = True
        await until(lambda: inventory.fleet is not None)
        tg.cancel_scope.cancel()


async def test_an_unchanged_revision_is_not_republished(http, discovery) -> None:
    inventory = Inventory()
    fleet, _ = inventory.followers(http)
    async with anyio.create_task_group() as tg:
        await tg.start(fleet.run)
        revision = inventory.fleet_store.revision
        discovery.fleet.publish(discovery.fleet.value)
        await until(lambda: discovery.polls >= 3)
        assert inventory.fleet_store.revision == revision
        tg.cancel_scope.cancel()


async def test_asked_once_returns_after_a_failed_first_call_too(http, discovery) -> None:
    discovery.available = False
    inventory = Inventory()
    async with anyio.create_task_group() as tg:
        for follower in inventory.followers(http):
            tg.start_soon(follower.run)
        with anyio.fail_after(2):
            await inventory.asked_once()
        assert inventory.fleet is None
        assert inventory.topology is None
        tg.cancel_scope.cancel()
