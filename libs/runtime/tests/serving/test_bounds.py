"""Input is refused by size, digits, length and depth before it is converted or walked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_runtime.errors import BadRequest
from rgpu_runtime.serving import (
    body_limit,
    create_service_app,
    decode_json,
    json_response,
    read_bounded_json,
)
from rgpu_runtime.serving._bounds import (
    MAX_JSON_DEPTH,
    bounded_int,
    check_dns_label,
    check_dns_subdomain,
    check_uid,
)

LIMIT = 64 * 1024
CHUNK = 16 * 1024


async def mutate(request: Request) -> Response:
    review = await read_bounded_json(request, what="AdmissionReview")
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


@pytest.mark.anyio
async def test_deep_nesting_is_refused_with_400_naming_the_path(client: httpx.AsyncClient) -> None:
    deep = b'{"request":' + b"[" * 200 + b"]" * 200 + b"}"
    reply = await client.post("/mutate", content=deep)
    assert reply.status_code == 400
    message = reply.json()["message"]
    assert f"nests deeper than {MAX_JSON_DEPTH} levels at $.request[0][0]" in message


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"[1, 2]", "must be a JSON object at $, got an array"),
        (b'"x"', "must be a JSON object at $, got a string"),
        (b"null", "got null"),
        (b"\xff\xfe", "is not valid JSON"),
        (b"[" * 5000, "is not valid JSON"),
    ],
)
async def test_wrong_top_level_types_and_broken_json_are_400(
    client: httpx.AsyncClient, body: bytes, expected: str
) -> None:
    reply = await client.post("/mutate", content=body)
    assert reply.status_code == 400
    assert expected in reply.json()["message"]


def test_nesting_at_the_bound_is_accepted_and_one_more_level_is_not() -> None:
    at_bound = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert decode_json(at_bound, what="body", expect="array") is not None
    with pytest.raises(BadRequest, match=r"at \$\[0\]"):
        decode_json(b"[" + at_bound + b"]", what="body", expect="array")


def test_an_ordinary_wide_document_is_accepted() -> None:
    doc = {"items": [{"metadata": {"name": f"n{i}", "labels": {"a": "b"}}} for i in range(2000)]}
    assert decode_json(orjson.dumps(doc), what="NodeList") == doc


@pytest.mark.parametrize(
    ("text", "value"), [("0", 0), ("42", 42), (" 7 ", 7), ("-3", -3), ("+5", 5)]
)
def test_bounded_int_reads_integers_in_range(text: str, value: int) -> None:
    assert bounded_int(text, field="since", minimum=-10, maximum=2**31 - 1) == value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9" * 5000, "... (5000 characters)"),
        ("1.5", "got '1.5'"),
        ("", "got ''"),
        ("0x10", "got '0x10'"),
        ("2147483648", "got 2147483648"),
        ("-11", "got -11"),
    ],
)
def test_bounded_int_refuses_long_malformed_or_out_of_range_values(
    text: str, expected: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        bounded_int(text, field="since", minimum=-10, maximum=2**31 - 1)
    assert caught.value.message.startswith("since: expected an integer -10..2147483647")
    assert expected in caught.value.message


def test_kubernetes_names_are_checked_against_their_own_limits() -> None:
    assert check_dns_subdomain("n" * 253, field="node") == "n" * 253
    assert check_dns_label("ml-team", field="namespace") == "ml-team"
    assert check_uid("3f1c2d4e-0000-4000-8000-000000000001", field="PodUID")
    with pytest.raises(BadRequest, match=r"node: .* at most 253 characters"):
        check_dns_subdomain("n" * 254, field="node")
    with pytest.raises(BadRequest, match=r"namespace: .* at most 63 characters"):
        check_dns_label("a" * 64, field="namespace")
    with pytest.raises(BadRequest, match=r"PodUID: .*\(70000 characters\).* at most 128"):
        check_uid("u" * 70000, field="PodUID")
    with pytest.raises(BadRequest, match="not a Kubernetes name"):
        check_dns_subdomain("Bad_Name", field="node")
    with pytest.raises(BadRequest, match="not a Kubernetes uid"):
        check_uid("a b", field="PodUID")
