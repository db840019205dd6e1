"""The peer clients: every answer and every transport failure becomes a value or one of our
errors; no httpx (or socket) exception leaves them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import orjson
import pytest

from rgpu_contracts import (
    Allocation,
    AllocationRequest,
    ContainerKind,
    ContainerRequest,
    NoFit,
    PodRef,
    PodUID,
)
from rgpu_extender.clients import AllocatorClient
from rgpu_extender.errors import (
    AllocatorUnavailable,
    ClaimNotHeld,
    PeerReplyInvalid,
)
from rgpu_runtime.errors import RgpuError
from rgpu_runtime.peers import http_client

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], httpx.Response]
REF = PodRef(uid=PodUID("uid-1"), namespace="ml-team", name="trainer-0")


@asynccontextmanager
async def allocator_with(handler: Handler) -> AsyncIterator[AllocatorClient]:
    transport = httpx.MockTransport(handler)
    async with http_client(base_url="http://allocator", timeout=1, transport=transport) as http:
        yield AllocatorClient(http)


def reply(status: int, body: object) -> Handler:
    return lambda request: httpx.Response(status, content=orjson.dumps(body))


def raising(exc: Exception) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


def request() -> AllocationRequest:
    container = ContainerRequest(name="main", kind=ContainerKind.APP, count=1)
    return AllocationRequest(pod=REF, containers=(container,))


async def test_allocate_decodes_an_allocation_and_a_no_fit(allocator) -> None:
    booked = allocator.allocation(REF)
    async with allocator_with(reply(200, booked.to_dict())) as client:
        assert await client.allocate(request()) == booked
    refused = NoFit(reasons=(), total=0)
    async with allocator_with(reply(409, refused.to_dict())) as client:
        answer = await client.allocate(request())
    assert isinstance(answer, NoFit)
    assert answer.message == "0/0 NoServers"


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429])
async def test_allocator_5xx_and_429_are_unavailable_and_retryable(status: int) -> None:
    body = {"code": "x", "message": "leases unreadable", "retryable": True}
    async with allocator_with(reply(status, body)) as client:
        with pytest.raises(AllocatorUnavailable) as caught:
            await client.allocate(request())
    assert caught.value.retryable
    assert str(status) in caught.value.message


@pytest.mark.parametrize(
    ("status", "body"),
    [(400, {"code": "bad_request", "message": "no"}), (200, {"pod": 1}), (200, [1])],
)
async def test_unexpected_answers_are_peer_reply_invalid(status: int, body: object) -> None:
    async with allocator_with(reply(status, body)) as client:
        with pytest.raises(PeerReplyInvalid) as caught:
            await client.allocate(request())
    assert caught.value.peer_status == status


async def test_a_body_that_is_not_json_is_peer_reply_invalid() -> None:
    handler: Handler = lambda request: httpx.Response(200, content=b"<html>")  # noqa: E731
    async with allocator_with(handler) as client:
        with pytest.raises(PeerReplyInvalid, match="outside its contract"):
            await client.allocate(request())


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        httpx.RemoteProtocolError("garbage"),
        OSError("reset"),
        TimeoutError(),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_library_exceptions_do_not_leak(exc: Exception) -> None:
    async with allocator_with(raising(exc)) as client:
        for call in (
            client.allocate(request()),
            client.commit("uid-1", "n"),
            client.release("uid-1"),
            client.find("uid-1"),
        ):
            with pytest.raises(RgpuError) as caught:
                await call
            assert isinstance(caught.value, AllocatorUnavailable)
            assert caught.value.__cause__ is exc


@pytest.mark.parametrize("status", [404, 409])
async def test_commit_refusals_mean_the_claim_is_not_held(status: int) -> None:
    body = {"code": "conflict", "message": "held by someone else"}
    async with allocator_with(reply(status, body)) as client:
        with pytest.raises(ClaimNotHeld, match="held by someone else"):
            await client.commit("uid-1", "node-1")


async def test_commit_posts_the_node_and_decodes_the_annotations(allocator) -> None:
    committed = allocator.allocation(REF, committed=True)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=orjson.dumps(committed.to_dict()))

    async with allocator_with(handler) as client:
        answer = await client.commit("uid-1", "node-1")
    assert isinstance(answer, Allocation)
    assert dict(answer.annotations)["hami.io/lupine-endpoint"] == allocator.endpoint
    assert seen[0].url.path == "/v1/allocations/uid-1/commit"
    assert orjson.loads(seen[0].content) == {"node": "node-1"}


@pytest.mark.parametrize("status", [204, 200, 404])
async def test_release_succeeds_when_the_claim_is_gone_either_way(status: int) -> None:
    async with allocator_with(lambda request: httpx.Response(status)) as client:
        await client.release("uid-1")


async def test_find_answers_none_without_a_claim() -> None:
    async with allocator_with(reply(404, {"code": "not_found", "message": "no"})) as client:
        assert await client.find("uid-1") is None
