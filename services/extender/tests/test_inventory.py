"""Following discovery's fleet and topology by long-poll, through outages."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from rgpu_extender.discovery_client import DiscoveryClient
from rgpu_extender.inventory import Inventory
from rgpu_runtime import Backoff, http_client

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(discovery) -> AsyncIterator[DiscoveryClient]:
    transport = discovery.transport
    async with http_client(base_url="http://discovery", timeout=1, transport=transport) as http:
        yield DiscoveryClient(http)


async def until(check) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(5):
        while not check():
            await anyio.sleep(0.01)


async def test_first_fleet_and_topology_are_there_once_started(client, discovery) -> None:
    inventory = Inventory()
    async with anyio.create_task_group() as tg:
        await tg.start(inventory.follow_fleet, client)
        await tg.start(inventory.follow_topology, client)
        assert inventory.fleet is not None
        assert set(inventory.fleet.servers) == {"gpu-node-2", "lupine-b"}
        assert inventory.topology is not None
        assert inventory.topology.labels["cpu-node-1"]["topology.rgpu.io/rack"] == "r2"
        tg.cancel_scope.cancel()


async def test_a_published_change_arrives_without_waiting_out_the_poll(
    client, discovery, make
) -> None:
    inventory = Inventory()
    async with anyio.create_task_group() as tg:
        await tg.start(inventory.follow_fleet, client)
        discovery.publish_fleet(make.fleet(make.server("new-server"), revision=5))
        await until(lambda: inventory.fleet and "new-server" in inventory.fleet.servers)
        assert inventory.fleet_store.value is inventory.fleet
        tg.cancel_scope.cancel()


async def test_outage_at_start_reports_started_then_recovers(client, discovery) -> None:
    discovery.available = False
    inventory = Inventory(backoff=Backoff(initial=0.01, maximum=0.05))
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(2):
            await tg.start(inventory.follow_fleet, client)
        assert inventory.fleet is None
        discovery.available = True
        await until(lambda: inventory.fleet is not None)
        tg.cancel_scope.cancel()


async def test_an_unchanged_revision_is_not_republished(client, discovery) -> None:
    inventory = Inventory()
    async with anyio.create_task_group() as tg:
        await tg.start(inventory.follow_fleet, client)
        revision = inventory.fleet_store.revision
        discovery.fleet.publish(discovery.fleet.value)
        await until(lambda: discovery.polls >= 3)
        assert inventory.fleet_store.revision == revision
        tg.cancel_scope.cancel()
