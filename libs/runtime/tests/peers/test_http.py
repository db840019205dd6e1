from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable

import aiohttp
import anyio
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_contracts import ErrorBody
from rgpu_runtime.errors import Unavailable, UpstreamError
from rgpu_runtime.peers import http_client, request_json, upstream_error
from rgpu_runtime.serving import Listener, json_response, running

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], httpx.Response]


def client_with(handler: Handler) -> httpx.AsyncClient:
    return http_client(
        base_url="http://allocator", timeout=1.0, transport=httpx.MockTransport(handler)
    )


def _body(code: str, retryable: bool = False) -> dict[str, object]:
    return {"code": code, "message": f"{code} happened", "retryable": retryable}


async def test_request_json_sends_json_and_decodes_the_contract() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=_body("ok"))

    async with client_with(handler) as client:
        body = await request_json(
            client, "POST", "/v1/x", decode=ErrorBody.from_dict, body={"a": 1}, params={"w": 2}
        )
    assert body == ErrorBody(code="ok", message="ok happened", retryable=False)
    assert seen[0].content == b'{"a":1}'
    assert seen[0].headers["content-type"] == "application/json"
    assert seen[0].url == "http://allocator/v1/x?w=2"


@pytest.mark.parametrize(
    ("raised", "message"),
    [
        (httpx.ConnectError("refused"), "cannot reach http://allocator/v1/x"),
        (httpx.ReadTimeout("slow"), "did not answer in time"),
        (httpx.RemoteProtocolError("hung up"), "cannot reach"),
        (aiohttp.ServerDisconnectedError(), "cannot reach"),
        (TimeoutError(), "did not answer in time"),
    ],
)
async def test_transport_failures_become_unavailable(raised: Exception, message: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise raised

    async with client_with(handler) as client:
        with pytest.raises(Unavailable) as caught:
            await request_json(client, "GET", "/v1/x", decode=ErrorBody.from_dict)
    assert message in caught.value.message
    assert caught.value.retryable
    assert caught.value.__cause__ is raised


@pytest.mark.parametrize("status", [429, 502, 503, 504])
async def test_overload_statuses_become_unavailable_with_retry_after(status: int) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=_body("busy", True), headers={"retry-after": "4"})

    async with client_with(handler) as client:
        with pytest.raises(Unavailable) as caught:
            await request_json(client, "GET", "/v1/x", decode=ErrorBody.from_dict)
    assert caught.value.retry_after == 4.0
    assert "busy happened" in caught.value.message


async def test_a_refusal_becomes_upstream_error_with_the_peer_body() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json=_body("claim_taken"))

    async with client_with(handler) as client:
        with pytest.raises(UpstreamError) as caught:
            await request_json(client, "POST", "/v1/x", decode=ErrorBody.from_dict, body={})
    error = caught.value
    assert error.peer_status == 409
    assert error.peer_body == ErrorBody(code="claim_taken", message="claim_taken happened")
    assert error.message == "http://allocator/v1/x answered 409: claim_taken happened"
    assert not error.retryable


async def test_a_refusal_without_an_error_body_uses_the_reason_phrase() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="<html>nope</html>")

    async with client_with(handler) as client:
        with pytest.raises(UpstreamError) as caught:
            await request_json(client, "GET", "/v1/x", decode=ErrorBody.from_dict)
    assert caught.value.peer_body is None
    assert caught.value.message.endswith("answered 404: Not Found")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"<html>", "not JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"code": 1, "message": "m"}', "does not match the contract: code: expected a string"),
    ],
)
async def test_an_undecodable_answer_becomes_upstream_error(content: bytes, message: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=content)

    async with client_with(handler) as client:
        with pytest.raises(UpstreamError, match=message):
            await request_json(client, "GET", "/v1/x", decode=ErrorBody.from_dict)


async def test_upstream_error_maps_a_raised_status_error() -> None:
    request = httpx.Request("GET", "http://discovery/v1/fleet")
    response = httpx.Response(503, request=request, headers={"retry-after": "1"})
    error = upstream_error(
        httpx.HTTPStatusError("503", request=request, response=response), peer="discovery"
    )
    assert isinstance(error, Unavailable)
    assert error.retry_after == 1.0


async def test_upstream_error_of_an_unexpected_httpx_error_is_not_retryable() -> None:
    error = upstream_error(httpx.TooManyRedirects("loop"), peer="discovery")
    assert isinstance(error, UpstreamError)
    assert not error.retryable


def _echo_app() -> Starlette:
    async def echo(request: Request) -> Response:
        return json_response(
            {
                "code": "echo",
                "message": request.headers.get("traceparent", ""),
                "retryable": False,
            }
        )

    async def slow(request: Request) -> Response:
        await anyio.sleep(0.3)
        return json_response(_body("late"))

    return Starlette(routes=[Route("/echo", echo), Route("/slow", slow)])


@pytest.fixture
async def echo_url() -> AsyncIterator[str]:
    async with running(_echo_app(), Listener(listen="127.0.0.1:0")) as (url,):
        yield url


async def test_default_transport_is_aiohttp_and_reuses_connections(echo_url: str) -> None:
    async with http_client(base_url=echo_url, timeout=2.0) as client:
        for _ in range(3):
            body = await request_json(client, "GET", "/echo", decode=ErrorBody.from_dict)
            assert body.code == "echo"
        transport = client._transport._transport  # type: ignore[attr-defined]
        session = transport.client
        assert isinstance(session, aiohttp.ClientSession)
        assert len(session.connector._conns) == 1  # type: ignore[union-attr]


async def test_the_aiohttp_transport_carries_the_callers_traceparent(echo_url: str) -> None:
    tracer = TracerProvider().get_tracer("test")
    async with http_client(base_url=echo_url, timeout=2.0) as client:
        with tracer.start_as_current_span("caller") as span:
            body = await request_json(client, "GET", "/echo", decode=ErrorBody.from_dict)
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert body.message.startswith(f"00-{trace_id}-")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_refused_connection_over_aiohttp_is_unavailable_without_leaks() -> None:
    async with http_client(base_url=f"http://127.0.0.1:{_closed_port()}", timeout=1.0) as client:
        with pytest.raises(Unavailable) as caught:
            await request_json(client, "GET", "/echo", decode=ErrorBody.from_dict)
    assert not isinstance(caught.value, aiohttp.ClientError | httpx.HTTPError)
    assert "cannot reach" in caught.value.message


async def test_a_slow_peer_over_aiohttp_is_unavailable_as_a_timeout(echo_url: str) -> None:
    async with http_client(base_url=echo_url, timeout=0.05) as client:
        with pytest.raises(Unavailable, match="did not answer in time"):
            await request_json(client, "GET", "/slow", decode=ErrorBody.from_dict)


async def test_a_long_poll_timeout_waits_long_for_answers_but_not_for_connects() -> None:
    seen: list[dict[str, float]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200, json=_body("ok"))

    async with client_with(handler) as client:
        await request_json(client, "GET", "/v1/fleet", decode=ErrorBody.from_dict, timeout=35.0)
        await request_json(client, "GET", "/v1/fleet", decode=ErrorBody.from_dict)
    assert seen[0] == {"connect": 2.0, "read": 35.0, "write": 35.0, "pool": 35.0}
    assert seen[1] == {"connect": 1.0, "read": 1.0, "write": 1.0, "pool": 1.0}
