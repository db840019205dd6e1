"""Several metrics replicas scraped at once: exactly one serves the card families (the holder
of the election Lease, on kubesim over real HTTP), the others only their own self-metrics and
stay ready; when the exporter stops, another takes over."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client.parser import text_string_to_metric_families

from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_metrics import FollowPolicy, create_app
from rgpu_runtime.replicas import ElectionTiming
from rgpu_runtime.settings import Settings
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

CARD_FAMILIES = ("hami_remote_gpu_", "rgpu_card_")
TIMING = ElectionTiming(lease_seconds=30, renew_deadline_seconds=20, retry_seconds=0.2)
"""A 30 s lease tried every 0.2 s: a handover within a test can only be a release."""


@pytest.fixture
async def sim() -> AsyncIterator[SimApiServer]:
    async with run_apiserver() as server:
        server.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
        yield server


@asynccontextmanager
async def replica(
    sim: SimApiServer, peers, policy: FollowPolicy
) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings.from_env(
        {
            "RGPU_KUBE_URL": sim.url,
            "RGPU_DISCOVERY_URL": "http://discovery",
            "RGPU_ALLOCATOR_URL": "http://allocator",
        },
        service="metrics",
    )
    app = create_app(
        settings,
        discovery_transport=httpx.MockTransport(peers.discovery.handle),
        allocator_transport=httpx.MockTransport(peers.allocator.handle),
        policy=policy,
        election=TIMING,
    )
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://metrics"
        ) as http,
    ):
        await eventually(lambda: ready(http))
        yield http


async def ready(http: httpx.AsyncClient) -> bool:
    return (await http.get("/readyz")).status_code == 200


def card_series(text: str) -> set[str]:
    return {
        line.split(" ")[0]
        for line in text.splitlines()
        if line.startswith(CARD_FAMILIES) and not line.startswith("#")
    }


async def scrape(http: httpx.AsyncClient) -> str:
    return (await http.get("/metrics")).text


async def test_of_two_replicas_only_the_leader_serves_card_series_and_both_stay_ready(
    sim, peers, policy
):
    async with replica(sim, peers, policy) as first, replica(sim, peers, policy) as second:
        leader_text, follower_text = await scrape(first), await scrape(second)
        assert card_series(leader_text)
        assert card_series(follower_text) == set()
        assert 'rgpu_leader{lease="rgpu-metrics-leader"} 1.0' in leader_text
        assert 'rgpu_leader{lease="rgpu-metrics-leader"} 0.0' in follower_text
        assert "rgpu_source_up" in follower_text  # the follower's own health is still served
        assert await ready(first) and await ready(second)


async def test_when_the_exporting_replica_stops_another_serves_every_card_series(
    sim, peers, policy
):
    async with AsyncExitStack() as stack:
        first_stack = AsyncExitStack()
        first = await first_stack.enter_async_context(replica(sim, peers, policy))
        second = await stack.enter_async_context(replica(sim, peers, policy))
        exported = card_series(await scrape(first))
        await first_stack.aclose()

        async def took_over() -> bool:
            return card_series(await scrape(second)) == exported

        await eventually(took_over, what="the second replica exports the same series")


async def test_three_replicas_together_serve_each_card_series_exactly_once(sim, peers, policy):
    async with (
        replica(sim, peers, policy) as a,
        replica(sim, peers, policy) as b,
        replica(sim, peers, policy) as c,
    ):
        seen: list[str] = []
        for http in (a, b, c):
            seen.extend(card_series(await scrape(http)))
    assert seen
    assert len(seen) == len(set(seen))


def _card_seconds(text: str) -> dict[str, float]:
    return {
        s.labels["namespace"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "rgpu_namespace_card_seconds_total"
    }


async def test_only_the_exporting_replica_counts_and_its_successor_starts_at_zero(
    sim, peers, policy, make
) -> None:
    peers.allocator.publish(make.claims(make.claim("gpu-a", [0, 1], namespace="ml"), revision=2))
    async with AsyncExitStack() as stack:
        first_stack = AsyncExitStack()
        first = await first_stack.enter_async_context(replica(sim, peers, policy))
        second = await stack.enter_async_context(replica(sim, peers, policy))

        async def counted() -> bool:
            return _card_seconds(await scrape(first)).get("ml", 0.0) > 0

        await eventually(counted, what="the exporter counts the claims")
        assert _card_seconds(await scrape(second)) == {}
        await first_stack.aclose()
        handed = time.monotonic()

        async def took_over() -> bool:
            return "ml" in _card_seconds(await scrape(second))

        await eventually(took_over, what="the second replica counts")
        counted_after = _card_seconds(await scrape(second))["ml"]
        bound = 2 * (time.monotonic() - handed)
    # Two cards since the handover at most: nothing of the first replica's share is carried.
    assert 0 < counted_after <= bound
