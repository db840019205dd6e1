"""The long-poll client: query, deadlines, statuses and bodies all end as values or our errors."""

from __future__ import annotations

import anyio
import httpx
import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider

from rgpu_contracts import ClaimSet, Fleet
from rgpu_metrics.errors import SourceInvalid, SourceUnavailable
from rgpu_metrics.sources import CLAIMS, FLEET, SourceClient
from rgpu_runtime import Unavailable, UpstreamError, http_client

pytestmark = pytest.mark.anyio


def fleet_client(handler, *, margin: float = 1.0) -> tuple[httpx.AsyncClient, SourceClient[Fleet]]:
    http = http_client(
        base_url="http://discovery", timeout=5.0, transport=httpx.MockTransport(handler)
    )
    return http, SourceClient(http, FLEET, margin=margin)


async def fetch(handler, since=None, wait=1.0, *, margin: float = 1.0):
    http, source = fleet_client(handler, margin=margin)
    async with http:
        return await source.fetch(since, wait)


def answering(status: int, content: bytes = b"", seen: list[httpx.Request] | None = None):
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=content)

    return handler


async def test_a_first_fetch_asks_for_the_current_value_without_since_or_wait(make):
    fleet = make.fleet(make.server("gpu-a"), revision=3)
    seen: list[httpx.Request] = []
    got = await fetch(answering(200, orjson.dumps(fleet.to_dict()), seen))
    assert got == fleet
    assert seen[0].url.path == "/v1/fleet"
    assert dict(seen[0].url.params) == {}


async def test_a_follow_up_fetch_sends_since_and_wait(make):
    seen: list[httpx.Request] = []
    body = orjson.dumps(make.fleet(revision=8).to_dict())
    await fetch(answering(200, body, seen), since=7, wait=2.5)
    assert dict(seen[0].url.params) == {"since": "7", "wait": "2.5"}


async def test_claims_decode_from_the_allocator_path(make):
    claims = make.claims(make.claim("gpu-a", [0, 1]), revision=2)
    seen: list[httpx.Request] = []
    handler = answering(200, orjson.dumps(claims.to_dict()), seen)
    async with http_client(
        base_url="http://allocator", timeout=5.0, transport=httpx.MockTransport(handler)
    ) as http:
        got: ClaimSet | None = await SourceClient(http, CLAIMS, margin=1.0).fetch(None, 1.0)
    assert got == claims
    assert seen[0].url.path == "/v1/claims"


async def test_not_modified_means_unchanged():
    assert await fetch(answering(304), since=4) is None


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
async def test_overload_and_server_errors_are_unavailable(status):
    with pytest.raises(SourceUnavailable, match=f"discovery: answered HTTP {status}") as caught:
        await fetch(answering(status, b'{"code":"x","message":"busy"}'))
    assert isinstance(caught.value, Unavailable)
    assert caught.value.retryable
    assert caught.value.source == "discovery"


@pytest.mark.parametrize("status", [400, 404, 410])
async def test_other_error_statuses_are_invalid_answers(status):
    with pytest.raises(SourceInvalid) as caught:
        await fetch(answering(status, b"no such route"))
    assert isinstance(caught.value, UpstreamError)
    assert caught.value.peer_status == status
    assert "no such route" in caught.value.message


async def test_a_body_that_is_not_json_is_an_invalid_answer():
    with pytest.raises(SourceInvalid, match="not JSON"):
        await fetch(answering(200, b"<html>"))


async def test_an_off_contract_body_names_the_offending_field():
    body = orjson.dumps({"revision": 1, "observedAt": 0, "servers": [{"name": 3}]})
    with pytest.raises(SourceInvalid, match=r"servers\[0\]") as caught:
        await fetch(answering(200, body))
    assert caught.value.peer_status == 200


async def test_a_connection_failure_is_unavailable_with_the_library_error_as_cause():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(SourceUnavailable, match="ConnectError") as caught:
        await fetch(refuse)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


async def test_a_peer_holding_past_wait_plus_margin_is_unavailable(make):
    async def hang(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(10)
        return httpx.Response(200)

    with anyio.fail_after(5):
        with pytest.raises(SourceUnavailable, match=r"no answer within 0\.15 s"):
            await fetch(hang, since=1, wait=0.1, margin=0.05)


async def test_the_call_carries_the_current_trace_as_traceparent(make):
    seen: list[httpx.Request] = []
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("scrape") as span:
        await fetch(answering(200, orjson.dumps(make.fleet().to_dict()), seen))
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert trace_id in seen[0].headers["traceparent"]


async def test_a_body_equal_to_the_last_decoded_one_is_reported_unchanged(make):
    fleet = make.fleet(make.server("gpu-a"), revision=3)
    http, source = fleet_client(answering(200, orjson.dumps(fleet.to_dict())))
    async with http:
        assert await source.fetch(None, 1.0) == fleet
        assert await source.fetch(3, 1.0) is None
        assert await source.fetch(None, 1.0) is None


async def test_a_changed_body_is_decoded_again(make):
    bodies = [orjson.dumps(make.fleet(revision=r).to_dict()) for r in (1, 2)]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=bodies.pop(0))

    http, source = fleet_client(handler)
    async with http:
        first, second = await source.fetch(None, 1.0), await source.fetch(1, 1.0)
    assert (first.revision, second.revision) == (1, 2)
