"""The exporter's two followers: each answer goes to the board, outages keep the last value
and are retried with capped backoff, recovery asks afresh, and failures are our errors."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider

from rgpu_contracts import ClaimSet, Fleet
from rgpu_metrics.board import Board
from rgpu_metrics.clients import POLICY, follow_claims, follow_fleet
from rgpu_runtime.errors import UpstreamError
from rgpu_runtime.feeds import Follower, FollowPolicy
from rgpu_runtime.peers import http_client

pytestmark = pytest.mark.anyio

TEST_POLICY = FollowPolicy(
    wait_seconds=30.0,
    margin_seconds=1.0,
    min_interval_seconds=0.0,
    backoff_initial_seconds=0.01,
    backoff_cap_seconds=0.02,
)


@asynccontextmanager
async def following(
    handler, board: Board, policy: FollowPolicy = TEST_POLICY
) -> AsyncIterator[Follower[Fleet]]:
    transport = httpx.MockTransport(handler)
    async with (
        http_client(base_url="http://discovery", timeout=5.0, transport=transport) as http,
        anyio.create_task_group() as tg,
    ):
        follower = follow_fleet(http, board, policy)
        await tg.start(follower.run)
        yield follower
        tg.cancel_scope.cancel()


async def wait_for(check: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not check():
            await anyio.sleep(0.005)


def answering(status: int, content: bytes = b"", seen: list[httpx.Request] | None = None):
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=content)

    return handler


def test_the_exporter_holds_polls_below_a_scrape_interval():
    assert POLICY.wait_seconds + POLICY.margin_seconds <= 15.0


async def test_the_first_answer_is_applied_and_marks_the_source_up(peers):
    board = Board()
    async with following(peers.discovery.handle, board) as follower:
        assert follower.status.answered.is_set()
        assert board.fleet == peers.discovery.value
        assert follower.status.up
        assert follower.status.revision == 1
        await wait_for(lambda: len(peers.discovery.requests) == 2)
        assert dict(peers.discovery.requests[0].url.params) == {"delta": "1"}
        assert dict(peers.discovery.requests[1].url.params) == {
            "since": "1",
            "wait": "30",
            "delta": "1",
        }


async def test_each_published_value_is_applied_in_turn(make, peers):
    board = Board()
    applied: list[int] = []
    async with following(peers.discovery.handle, board) as follower:
        applied.append(follower.status.revision or 0)
        for revision in (2, 3):
            await wait_for(lambda: peers.discovery.requests[-1].url.params.get("since") is not None)
            peers.discovery.publish(make.fleet(make.server("gpu-x"), revision=revision))
            await wait_for(lambda: follower.status.revision == revision)  # noqa: B023
            assert board.fleet is not None
            applied.append(board.fleet.revision)
    assert applied == [1, 2, 3]


async def test_an_outage_keeps_the_last_value_and_asks_afresh_after_recovery(make, peers):
    board = Board()
    async with following(peers.discovery.handle, board) as follower:
        peers.discovery.set_mode("down")
        await wait_for(lambda: not follower.status.up)
        assert "connection refused" in follower.status.last_error
        assert board.fleet == peers.discovery.value
        failed_at = len(peers.discovery.requests)
        peers.discovery.publish(make.fleet(make.server("gpu-b"), revision=5))
        await wait_for(lambda: follower.status.up)
        retry = peers.discovery.requests[failed_at:]
        assert retry[0].url.params["wait"] == "0"
        assert board.fleet is not None
        assert board.fleet.revision == 5
        assert follower.status.last_error == ""


async def test_an_outage_is_logged_once_and_retried_with_capped_backoff(peers, caplog):
    board = Board()
    with caplog.at_level(logging.INFO, logger="rgpu_runtime"):
        async with following(peers.discovery.handle, board) as follower:
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
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if "since" in request.url.params:
            return httpx.Response(304)
        return httpx.Response(
            200, content=orjson.dumps(Fleet(revision=1, observed_at=0, servers=()).to_dict())
        )

    policy = FollowPolicy(wait_seconds=1.0, min_interval_seconds=0.01)
    async with following(handler, Board(), policy) as follower:
        await wait_for(lambda: len(seen) >= 4)
        assert follower.status.up
    # ``latest`` moves once per value taken.
    assert follower.latest.revision == 1


async def test_a_peer_ignoring_wait_is_polled_no_faster_than_the_minimum_interval(peers):
    def immediate(request: httpx.Request) -> httpx.Response:
        peers.discovery.requests.append(request)
        return httpx.Response(200, content=orjson.dumps(peers.discovery.value.to_dict()))

    policy = FollowPolicy(wait_seconds=30.0, min_interval_seconds=0.05)
    async with following(immediate, Board(), policy):
        await anyio.sleep(0.3)
    assert 2 <= len(peers.discovery.requests) <= 8


async def test_claims_decode_from_the_allocator_path(make):
    claims = make.claims(make.claim("gpu-a", [0, 1]), revision=2)
    seen: list[httpx.Request] = []
    handler = answering(200, orjson.dumps(claims.to_dict()), seen)
    board = Board()
    async with http_client(
        base_url="http://allocator", timeout=5.0, transport=httpx.MockTransport(handler)
    ) as http:
        follower = follow_claims(http, board, TEST_POLICY)
        assert await follower.poll_once()
    got: ClaimSet | None = board.claims
    assert got == claims
    assert follower.status.name == "allocator"
    assert seen[0].url.path == "/v1/claims"


async def test_an_off_contract_body_names_the_offending_field():
    body = orjson.dumps({"revision": 1, "observedAt": 0, "servers": [{"name": 3}]})
    async with http_client(
        base_url="http://discovery",
        timeout=5.0,
        transport=httpx.MockTransport(answering(200, body)),
    ) as http:
        with pytest.raises(UpstreamError, match=r"servers\[0\]") as caught:
            await follow_fleet(http, Board(), TEST_POLICY).poll_once()
    assert caught.value.peer_status == 200


async def test_the_call_carries_the_current_trace_as_traceparent(make):
    seen: list[httpx.Request] = []
    handler = answering(200, orjson.dumps(make.fleet().to_dict()), seen)
    tracer = TracerProvider().get_tracer("test")
    async with http_client(
        base_url="http://discovery", timeout=5.0, transport=httpx.MockTransport(handler)
    ) as http:
        with tracer.start_as_current_span("scrape") as span:
            await follow_fleet(http, Board(), TEST_POLICY).poll_once()
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert trace_id in seen[0].headers["traceparent"]
