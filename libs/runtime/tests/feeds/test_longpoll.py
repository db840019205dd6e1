"""The long-poll server side: ``since``/``wait`` read and bounded, the request held on a
``Versioned`` until the revision differs, bad input a named 400 — through a real ASGI app."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_runtime.errors import BadRequest
from rgpu_runtime.feeds import Poll, Versioned
from rgpu_runtime.feeds._longpoll import DEFAULT_WAIT_SECONDS
from rgpu_runtime.serving import create_service_app, json_response

pytestmark = pytest.mark.anyio


@pytest.fixture
def things() -> Versioned[str]:
    return Versioned("first", revision=7)


@pytest.fixture
async def client(things: Versioned[str]) -> AsyncIterator[httpx.AsyncClient]:
    async def get_things(request: Request) -> Response:
        revision, value = await Poll.from_query(request.query_params).answer(things)
        return json_response({"revision": revision, "value": value})

    app = create_service_app(service="test", routes=[Route("/v1/things", get_things)])
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://svc"
        ) as http,
    ):
        yield http


async def test_without_since_the_current_value_comes_at_once(client: httpx.AsyncClient) -> None:
    answer = await client.get("/v1/things")
    assert answer.json() == {"revision": 7, "value": "first"}


async def test_a_since_below_the_current_revision_answers_at_once(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/v1/things", params={"since": "3", "wait": "60"})
    assert answer.json() == {"revision": 7, "value": "first"}


async def test_a_since_above_the_current_revision_is_held_until_it_is_passed(
    client: httpx.AsyncClient, things: Versioned[str]
) -> None:
    answers: list[httpx.Response] = []

    async def ask() -> None:
        answers.append(await client.get("/v1/things", params={"since": "9", "wait": "60"}))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            for value in ("second", "third"):
                await anyio.wait_all_tasks_blocked()
                things.publish(value)
            await anyio.wait_all_tasks_blocked()
            assert answers == []
            things.publish("fourth")
    assert answers[0].json() == {"revision": 10, "value": "fourth"}


async def test_a_held_request_answers_the_next_publish(
    client: httpx.AsyncClient, things: Versioned[str]
) -> None:
    answers: list[httpx.Response] = []

    async def ask() -> None:
        answers.append(await client.get("/v1/things", params={"since": "7", "wait": "60"}))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            assert answers == []
            things.publish("second")
    assert answers[0].json() == {"revision": 8, "value": "second"}


async def test_a_held_request_answers_unchanged_when_the_wait_runs_out(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/v1/things", params={"since": "7", "wait": "0"})
    assert answer.status_code == 200
    assert answer.json() == {"revision": 7, "value": "first"}


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ({"since": "-1"}, "since"),
        ({"since": "abc"}, "since"),
        ({"since": "1.5"}, "since"),
        ({"since": ""}, "since"),
        ({"since": "١٢"}, "since"),
        ({"since": "1" * 20}, "since"),
        ({"since": "9" * 5000}, "since"),
        ({"since": "1", "wait": "61"}, "wait"),
        ({"since": "1", "wait": "-0.1"}, "wait"),
        ({"since": "1", "wait": "soon"}, "wait"),
        ({"since": "1", "wait": "nan"}, "wait"),
        ({"since": "1", "wait": "inf"}, "wait"),
        ({"wait": "5"}, "wait"),
        ({"since": "1", "delta": "yes"}, "delta"),
        ({"delta": "2"}, "delta"),
    ],
)
async def test_an_unusable_parameter_is_a_400_naming_it(
    client: httpx.AsyncClient, query: dict[str, str], parameter: str
) -> None:
    answer = await client.get("/v1/things", params=query)
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "bad_parameter"
    assert f"query parameter {parameter!r}" in body["message"]
    assert len(body["message"]) < 300


def test_since_without_wait_waits_the_default() -> None:
    assert Poll.from_query({"since": "5"}) == Poll(since=5, wait=DEFAULT_WAIT_SECONDS)


def test_no_parameters_mean_answer_now() -> None:
    assert Poll.from_query({}) == Poll(since=None, wait=0.0, delta=False)


@pytest.mark.parametrize(
    ("raw", "delta"), [("1", True), ("true", True), ("0", False), ("FALSE", False)]
)
def test_delta_is_an_opt_in_switch(raw: str, delta: bool) -> None:
    assert Poll.from_query({"since": "5", "delta": raw}).delta is delta
    assert Poll.from_query({"delta": raw}) == Poll(delta=delta)


def test_an_answer_below_since_is_behind() -> None:
    poll = Poll(since=5, wait=1.0)
    assert (poll.behind(4), poll.behind(5), Poll().behind(0)) == (True, False, False)


def test_nineteen_digits_are_a_revision() -> None:
    assert Poll.from_query({"since": "9" * 19, "wait": "2.5"}) == Poll(
        since=int("9" * 19), wait=2.5
    )


def test_a_bad_parameter_is_a_bad_request_with_the_value_and_the_fix() -> None:
    with pytest.raises(BadRequest) as caught:
        Poll.from_query({"since": "abc"})
    assert "since='abc'" in caught.value.message
    assert "whole number" in caught.value.message
