from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypedDict

import anyio
import httpx
import pytest
from anyio.abc import TaskStatus
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from rgpu_contracts import ErrorBody
from rgpu_runtime.errors import Unavailable
from rgpu_runtime.serving import (
    Readiness,
    create_service_app,
    json_response,
    read_json,
    state_value,
)
from rgpu_runtime.settings import DEFAULT_MAX_BODY_BYTES as MAX_BODY_BYTES

pytestmark = pytest.mark.anyio


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    greeting: str


class State(TypedDict):
    deps: Deps


def deps(request: Request) -> Deps:
    return state_value(request, "deps", Deps)


async def hello(request: Request) -> Response:
    return json_response({"greeting": deps(request).greeting, "id": request.path_params["id"]})


async def thing(request: Request) -> Response:
    return json_response({"name": request.path_params["name"]})


async def echo(request: Request) -> Response:
    return json_response(await read_json(request))


async def decode_error_body(request: Request) -> Response:
    return json_response(ErrorBody.from_dict(await read_json(request)).to_dict())


async def unavailable(request: Request) -> Response:
    raise Unavailable("discovery is down; retry later", retry_after=2.4)


async def crash(request: Request) -> Response:
    raise RuntimeError("secret internal detail")


ROUTES = [
    Route("/items/{id}", hello, methods=["GET"]),
    Route("/echo", echo, methods=["POST"]),
    Route("/error-body", decode_error_body, methods=["POST"]),
    Route("/unavailable", unavailable, methods=["GET"]),
    Route("/crash", crash, methods=["GET"]),
    Mount("/v1", routes=[Route("/things/{name}", thing, methods=["GET"])]),
]


@asynccontextmanager
async def greeting_lifespan(app: Starlette) -> AsyncIterator[State]:
    yield {"deps": Deps(greeting="hi")}


def make_app(**kwargs: object) -> Starlette:
    options: dict[str, object] = {
        "service": "test",
        "routes": ROUTES,
        "lifespan": greeting_lifespan,
    }
    options.update(kwargs)
    return create_service_app(**options)  # type: ignore[arg-type]


@asynccontextmanager
async def client_for(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
            yield client


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def client(registry: CollectorRegistry) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(make_app(registry=registry)) as client:
        yield client


async def test_healthz_answers_200(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200


async def test_handlers_reach_typed_lifespan_state(client: httpx.AsyncClient) -> None:
    response = await client.get("/items/7")
    assert response.json() == {"greeting": "hi", "id": "7"}


async def test_state_value_without_lifespan_raises_a_hint() -> None:
    transport = httpx.ASGITransport(app=make_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
        with pytest.raises(RuntimeError, match="LifespanManager"):
            await client.get("/items/7")


async def test_readyz_is_ready_once_the_lifespan_yielded_when_no_readiness_is_given(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/readyz")
    assert (response.status_code, response.json()) == (200, {"ready": True})


async def test_readyz_stays_503_until_the_lifespan_flips_readiness() -> None:
    readiness = Readiness()
    first_sync = anyio.Event()

    async def watcher(*, task_status: TaskStatus[None]) -> None:
        task_status.started()
        await first_sync.wait()
        readiness.set_ready()
        await anyio.sleep_forever()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        async with anyio.create_task_group() as tg:
            await tg.start(watcher)
            yield {"deps": Deps(greeting="hi")}
            tg.cancel_scope.cancel()

    async with client_for(make_app(lifespan=lifespan, readiness=readiness)) as client:
        response = await client.get("/readyz")
        assert (response.status_code, response.json()) == (
            503,
            {"ready": False, "reason": "starting"},
        )
        first_sync.set()
        await anyio.wait_all_tasks_blocked()
        assert (await client.get("/readyz")).status_code == 200
    assert readiness.reason == "stopped"


async def test_readiness_can_be_withdrawn_with_a_reason() -> None:
    readiness = Readiness()
    readiness.set_ready()
    async with client_for(make_app(readiness=readiness)) as client:
        readiness.set_not_ready("watch lost; relisting")
        response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["reason"] == "watch lost; relisting"


async def test_malformed_json_is_400_naming_line_and_column(client: httpx.AsyncClient) -> None:
    response = await client.post("/echo", content=b'{"a": 1,\n "b": }')
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "bad_request"
    assert "line 2 column 7" in body["message"]


async def test_valid_json_round_trips(client: httpx.AsyncClient) -> None:
    response = await client.post("/echo", json={"a": [1, 2.5, None, "x"]})
    assert response.json() == {"a": [1, 2.5, None, "x"]}


async def test_body_at_the_limit_is_accepted(client: httpx.AsyncClient) -> None:
    payload = b'"' + b"x" * (MAX_BODY_BYTES - 2) + b'"'
    response = await client.post("/echo", content=payload)
    assert response.status_code == 200


async def test_body_over_the_limit_with_content_length_is_413(client: httpx.AsyncClient) -> None:
    response = await client.post("/echo", content=b"x" * (MAX_BODY_BYTES + 1))
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


async def test_body_over_the_limit_without_content_length_is_413(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(17):
            yield b"y" * 65536

    response = await client.post("/echo", content=chunks())
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


async def test_body_longer_than_its_content_length_claims_is_413(client: httpx.AsyncClient) -> None:
    request = client.build_request("POST", "/echo", content=b"z" * (MAX_BODY_BYTES + 10))
    request.headers["content-length"] = "10"
    response = await client.send(request)
    assert response.status_code == 413


async def test_contract_error_is_400_with_the_path(client: httpx.AsyncClient) -> None:
    response = await client.post("/error-body", json={"code": 7, "message": "m"})
    assert response.status_code == 400
    assert response.json()["message"] == "invalid request body: code: expected a string, got number"


async def test_rgpu_error_maps_to_its_status_body_and_retry_after(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/unavailable")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert response.json() == {
        "code": "unavailable",
        "message": "discovery is down; retry later",
        "retryable": True,
    }


async def test_unknown_exception_is_a_generic_500_and_the_app_keeps_serving(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/crash")
    assert response.status_code == 500
    body = response.json()
    assert body["code"] == "internal"
    assert "secret" not in response.text
    assert "Traceback" not in response.text
    assert (await client.get("/healthz")).status_code == 200


async def test_unknown_route_is_a_404_error_body(client: httpx.AsyncClient) -> None:
    response = await client.get("/nowhere")
    assert response.status_code == 404
    assert response.json() == {
        "code": "not_found",
        "message": "no route for GET /nowhere",
        "retryable": False,
    }


async def test_wrong_method_is_a_405_error_body(client: httpx.AsyncClient) -> None:
    response = await client.delete("/echo")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def _latency_samples(text: str) -> dict[tuple[str, str, str], float]:
    counts: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "rgpu_http_request_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_count"):
                labels = sample.labels
                assert labels["service"] == "test"
                counts[(labels["method"], labels["route"], labels["status"])] = sample.value
    return counts


async def test_metrics_expose_latency_per_route_template(client: httpx.AsyncClient) -> None:
    for item in ("1", "2", "3"):
        await client.get(f"/items/{item}")
    await client.get("/v1/things/a")
    await client.get("/crash")
    await client.get("/nowhere")
    counts = _latency_samples((await client.get("/metrics")).text)
    assert counts[("GET", "/items/{id}", "200")] == 3
    assert counts[("GET", "/v1/things/{name}", "200")] == 1
    assert counts[("GET", "/crash", "500")] == 1
    assert counts[("GET", "<unmatched>", "404")] == 1


async def test_metrics_serve_the_services_own_registry(registry: CollectorRegistry) -> None:
    Counter("rgpu_test_things", "Things counted by the test.", registry=registry).inc(4)
    async with client_for(make_app(registry=registry)) as client:
        text = (await client.get("/metrics")).text
    assert "rgpu_test_things_total 4.0" in text


async def test_metrics_negotiate_openmetrics(client: httpx.AsyncClient) -> None:
    response = await client.get("/metrics", headers={"accept": "application/openmetrics-text"})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")


async def test_each_app_counts_only_its_own_requests() -> None:
    async with client_for(make_app()) as first:
        await first.get("/healthz")
    async with client_for(make_app()) as second:
        await second.get("/healthz")
        await second.get("/healthz")
        counts = _latency_samples((await second.get("/metrics")).text)
    assert counts == {("GET", "/healthz", "200"): 2}


async def test_a_client_gone_before_its_body_arrived_is_a_400_not_a_crash(
    registry: CollectorRegistry,
) -> None:
    app = make_app(registry=registry)
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/echo",
        "raw_path": b"/echo",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"64")],
        "client": ("127.0.0.1", 40000),
        "server": ("svc", 80),
    }
    async with LifespanManager(app) as manager:
        await manager.app(scope, receive, send)
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    assert start["status"] == 400
