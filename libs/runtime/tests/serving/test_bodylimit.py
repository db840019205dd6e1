"""A body is refused by its size while it streams in, before it is read whole or decoded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_runtime.serving import body_limit, create_service_app, json_response, read_json

LIMIT = 64 * 1024
CHUNK = 16 * 1024


async def mutate(request: Request) -> Response:
    review = await read_json(request)
    return json_response({"keys": sorted(review)})  # type: ignore[arg-type]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    routes = [
        Route("/mutate", mutate, methods=["POST"], middleware=[body_limit(LIMIT)]),
        Route(
            "/filter",
            mutate,
            methods=["POST"],
            middleware=[body_limit(LIMIT // 2, setting="RGPU_MAX_BODY_BYTES")],
        ),
    ]
    app = create_service_app(service="extender", routes=routes, max_body_bytes=4 * LIMIT)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
            yield http


@pytest.mark.anyio
async def test_a_16_mib_chunked_body_is_refused_once_the_route_limit_is_passed(
    client: httpx.AsyncClient,
) -> None:
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range((16 << 20) // CHUNK):
            sent += CHUNK
            yield b" " * CHUNK

    reply = await client.post("/mutate", content=body())
    assert reply.status_code == 413
    assert f"limit of {LIMIT} bytes" in reply.json()["message"]
    # Reading stopped one chunk past the limit: the rest of the 16 MiB was never pulled.
    assert sent <= LIMIT + CHUNK


@pytest.mark.anyio
async def test_an_oversized_declared_length_is_refused_before_reading_and_names_the_setting(
    client: httpx.AsyncClient,
) -> None:
    reply = await client.post("/filter", content=b"x" * (LIMIT // 2 + 1))
    assert reply.status_code == 413
    assert "raise RGPU_MAX_BODY_BYTES" in reply.json()["message"]


@pytest.mark.anyio
async def test_a_content_length_of_thousands_of_digits_is_413_not_a_crash() -> None:
    app = create_service_app(
        service="extender",
        routes=[Route("/mutate", mutate, methods=["POST"], middleware=[body_limit(LIMIT)])],
    )
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mutate",
        "raw_path": b"/mutate",
        "query_string": b"",
        "headers": [(b"content-length", b"9" * 5000)],
        "scheme": "http",
        "server": ("svc", 80),
        "root_path": "",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
        "state": {},
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 413
