"""A follower mirrors one source: applies each answer, survives outages, backs off, recovers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
import orjson
import pytest

from rgpu_contracts import Fleet
from rgpu_metrics.following import Follower, FollowPolicy, SourceStatus
from rgpu_metrics.sources import FLEET, SourceClient
from rgpu_runtime import http_client

pytestmark = pytest.mark.anyio

POLICY = FollowPolicy(
    wait_seconds=30.0,
    margin_seconds=1.0,
    min_interval_seconds=0.0,
    backoff_initial_seconds=0.01,
    backoff_cap_seconds=0.02,
)

Handler = Callable[[httpx.Request], object]


@asynccontextmanager
async def following(
    handler, applied: list[Fleet], policy: FollowPolicy = POLICY
) -> AsyncIterator[Follower[Fleet]]:
    transport = httpx.MockTransport(handler)
    async with (
        http_client(base_url="http://discovery", timeout=5.0, transport=transport) as http,
        anyio.create_task_group() as tg,
    ):
        follower = Follower(
            SourceClient(http, FLEET, margin=policy.margin_seconds),
            policy=policy,
            apply=applied.append,
            revision=lambda fleet: fleet.revision,
        )
        await tg.start(follower.run)
        yield follower
        tg.cancel_scope.cancel()


async def wait_for(check: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not check():
            await anyio.sleep(0.005)


async def test_the_first_answer_is_applied_and_marks_the_source_up(peers):
    applied: list[Fleet] = []
    async with following(peers.discovery.handle, applied) as follower:
        await follower.status.answered.wait()
        assert applied == [peers.discovery.value]
        assert follower.status.up
        assert follower.status.revision == 1
        await wait_for(lambda: len(peers.discovery.requests) == 2)
        assert dict(peers.discovery.requests[1].url.params) == {"since": "1", "wait": "30"}


async def test_each_published_value_is_applied_in_turn(make, peers):
    applied: list[Fleet] = []
    async with following(peers.discovery.handle, applied) as follower:
        await follower.status.answered.wait()
        for revision in (2, 3):
            await wait_for(lambda: peers.discovery.requests[-1].url.params.get("since") is not None)
            peers.discovery.publish(make.fleet(make.server("gpu-x"), revision=revision))
            await wait_for(lambda: follower.status.revision == revision)  # noqa: B023
    assert [fleet.revision for fleet in applied] == [1, 2, 3]


async def test_an_outage_keeps_the_last_value_and_asks_afresh_after_recovery(make, peers):
    applied: list[Fleet] = []
    async with following(peers.discovery.handle, applied) as follower:
        await follower.status.answered.wait()
        peers.discovery.set_mode("down")
        await wait_for(lambda: not follower.status.up)
        assert "connection refused" in follower.status.last_error
        assert applied == [peers.discovery.value]
        failed_at = len(peers.discovery.requests)
        peers.discovery.publish(make.fleet(make.server("gpu-b"), revision=5))
        await wait_for(lambda: follower.status.up)
        retry = peers.discovery.requests[failed_at:]
        assert "since" not in retry[0].url.params
        assert applied[-1].revision == 5
        assert follower.status.last_error == ""


async def test_an_outage_is_logged_once_and_retried_with_capped_backoff(peers, caplog):
    applied: list[Fleet] = []
    with caplog.at_level(logging.INFO, logger="rgpu_metrics.following"):
        async with following(peers.discovery.handle, applied) as follower:
            await follower.status.answered.wait()
            peers.discovery.set_mode("error")
            await wait_for(lambda: not follower.status.up)
            before = len(peers.discovery.requests)
            await anyio.sleep(0.3)
            retries = len(peers.discovery.requests) - before
            peers.discovery.set_mode("up")
            await wait_for(lambda: follower.status.up)
    # 0.3 s of retries at most 0.02 s apart, at least 0.005 s apart (jitter halves at most).
    assert 5 <= retries <= 60
    messages = [r.getMessage() for r in caplog.records]
    assert sum("failed" in m for m in messages) == 1
    assert sum("is back" in m for m in messages) == 1


async def test_unchanged_answers_refresh_the_source_without_reapplying():
    applied: list[Fleet] = []
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if "since" in request.url.params:
            return httpx.Response(304)
        return httpx.Response(
            200, content=orjson.dumps(Fleet(revision=1, observed_at=0, servers=()).to_dict())
        )

    policy = FollowPolicy(wait_seconds=1.0, min_interval_seconds=0.01)
    async with following(handler, applied, policy) as follower:
        await wait_for(lambda: len(seen) >= 4)
        assert follower.status.up
    assert len(applied) == 1


async def test_a_peer_ignoring_wait_is_polled_no_faster_than_the_minimum_interval(peers):
    def immediate(request: httpx.Request) -> httpx.Response:
        peers.discovery.requests.append(request)
        return httpx.Response(200, content=orjson.dumps(peers.discovery.value.to_dict()))

    policy = FollowPolicy(wait_seconds=30.0, min_interval_seconds=0.05)
    async with following(immediate, [], policy):
        await anyio.sleep(0.3)
    assert 2 <= len(peers.discovery.requests) <= 8


async def test_age_counts_from_the_last_success_and_is_unknown_before_it():
    status = SourceStatus("discovery")
    assert status.age(100.0) is None
    status.last_success = 90.0
    assert status.age(100.0) == 10.0
    assert status.age(80.0) == 0.0
