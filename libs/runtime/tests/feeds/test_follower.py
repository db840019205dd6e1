"""The long-poll follower: takes each new revision once, paces unchanged answers, backs off
(capped) on failures and asks afresh after them, never steps back, reports started after
its first answer, and lets no library exception out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_contracts import ContractError
from rgpu_runtime.errors import Unavailable, UpstreamError
from rgpu_runtime.feeds import Follower, FollowPolicy, Mirror, Poll, Versioned
from rgpu_runtime.feeds._feed import Feed
from rgpu_runtime.peers import http_client
from rgpu_runtime.serving import create_service_app, json_response
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

POLICY = FollowPolicy(
    wait_seconds=60.0,
    margin_seconds=5.0,
    min_interval_seconds=0.25,
    backoff_initial_seconds=0.1,
    backoff_cap_seconds=0.4,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Thing:
    revision: int
    value: str = "v"

    @classmethod
    def from_dict(cls, raw: object) -> Thing:
        if not isinstance(raw, dict) or not isinstance(raw.get("revision"), int):
            raise ContractError("revision", "expected an integer")
        return cls(revision=raw["revision"], value=str(raw.get("value", "")))

    def body(self) -> bytes:
        return orjson.dumps({"revision": self.revision, "value": self.value})


@dataclass(slots=True)
class Pace:
    """A fake clock that moves only when the follower sleeps, and the sleeps it asked for."""

    now: float = 0.0
    pauses: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        await anyio.lowlevel.checkpoint()


Step = Thing | int | Exception


@dataclass(slots=True)
class Script:
    """A peer that answers ``steps`` in turn (a value, a status, or a raised failure), then
    repeats the last one."""

    steps: list[Step]
    requests: list[httpx.Request] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.steps[min(len(self.requests), len(self.steps)) - 1]
        if isinstance(step, Exception):
            raise step
        if isinstance(step, int):
            return httpx.Response(step, json={"code": "x", "message": "no", "retryable": False})
        return httpx.Response(200, content=step.body())


THINGS = Feed(path="/v1/things", key="things", decode=Thing.from_dict)


def refused() -> httpx.ConnectError:
    return httpx.ConnectError("connection refused")


def make_follower(
    http: httpx.AsyncClient, pace: Pace, taken: list[Thing], policy: FollowPolicy = POLICY
) -> Follower[Thing]:
    mirror = Mirror(THINGS, name="peer", on_change=taken.append)
    return Follower(http, mirror, policy=policy, clock=pace.clock, sleep=pace.sleep)


@asynccontextmanager
async def following(
    transport: httpx.AsyncBaseTransport,
    pace: Pace,
    taken: list[Thing],
    policy: FollowPolicy = POLICY,
) -> AsyncIterator[Follower[Thing]]:
    async with (
        http_client(base_url="http://peer", timeout=5.0, transport=transport) as http,
        anyio.create_task_group() as tg,
    ):
        follower = make_follower(http, pace, taken, policy)
        with anyio.fail_after(5):
            await tg.start(follower.run)
        yield follower
        tg.cancel_scope.cancel()


@pytest.fixture
def pace() -> Pace:
    return Pace()


@pytest.fixture
def things() -> Versioned[Thing]:
    return Versioned(Thing(revision=1), revision=1)


@pytest.fixture
async def peer(things: Versioned[Thing]) -> AsyncIterator[httpx.AsyncBaseTransport]:
    """A real ASGI peer serving ``things`` by long-poll."""

    async def get_things(request: Request) -> Response:
        _, thing = await Poll.from_query(request.query_params).answer(things)
        return json_response({"revision": thing.revision, "value": thing.value})

    app = create_service_app(service="peer", routes=[Route("/v1/things", get_things)])
    async with LifespanManager(app) as manager:
        yield httpx.ASGITransport(app=manager.app)


async def test_each_new_revision_of_a_real_peer_is_taken_once_in_order(
    peer: httpx.AsyncBaseTransport, things: Versioned[Thing], pace: Pace
) -> None:
    taken: list[Thing] = []
    async with following(peer, pace, taken) as follower:
        for revision in (2, 3):
            await anyio.wait_all_tasks_blocked()
            things.publish(Thing(revision=revision))
            with anyio.fail_after(5):
                await follower.latest.wait_newer(revision - 1, 5)
    assert [thing.revision for thing in taken] == [1, 2, 3]
    assert follower.latest.value == Thing(revision=3)
    assert pace.pauses == []


async def test_started_is_reported_after_the_first_answer_not_the_first_attempt(
    pace: Pace,
) -> None:
    script = Script([refused(), refused(), Thing(revision=4)])
    taken: list[Thing] = []
    answered_before: list[bool] = []

    def handle(request: httpx.Request) -> httpx.Response:
        answered_before.append(follower.status.answered.is_set())
        return script.handle(request)

    async with http_client(
        base_url="http://peer", timeout=5.0, transport=httpx.MockTransport(handle)
    ) as http:
        follower = make_follower(http, pace, taken)
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(5):
                await tg.start(follower.run)
            assert follower.status.up
            assert taken == [Thing(revision=4)]
            tg.cancel_scope.cancel()
    assert answered_before[:3] == [False, False, False]


async def test_an_unchanged_answer_is_not_retaken_and_spaces_the_next_call(pace: Pace) -> None:
    script = Script([Thing(revision=1), Thing(revision=1), 304])
    taken: list[Thing] = []
    async with following(httpx.MockTransport(script.handle), pace, taken):
        await eventually(lambda: len(script.requests) >= 5)
    assert taken == [Thing(revision=1)]
    # The clock stands still during calls, so each pause is the whole minimum interval.
    assert pace.pauses[:3] == [0.25, 0.25, 0.25]
    assert dict(script.requests[1].url.params) == {"since": "1", "wait": "60"}


async def test_a_coalescing_follower_pauses_after_each_change_and_only_after_changes(
    pace: Pace,
) -> None:
    script = Script([Thing(revision=1), Thing(revision=2), Thing(revision=2)])
    taken: list[Thing] = []
    policy = FollowPolicy(min_interval_seconds=0.25, coalesce_seconds=0.5)
    async with following(httpx.MockTransport(script.handle), pace, taken, policy):
        await eventually(lambda: len(script.requests) >= 4)
    assert taken == [Thing(revision=1), Thing(revision=2)]
    # Two changes, each followed by the coalescing pause; then unchanged answers, paced.
    assert pace.pauses[:3] == [0.5, 0.5, 0.25]


async def test_an_outage_keeps_the_value_backs_off_capped_and_asks_afresh(
    pace: Pace, caplog: pytest.LogCaptureFixture
) -> None:
    script = Script([Thing(revision=1), *(refused() for _ in range(5)), Thing(revision=1)])
    taken: list[Thing] = []
    during: list[tuple[bool, int, str, Thing | None]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if len(script.requests) == 6:  # the call after five failures
            status = follower.status
            during.append((status.up, status.failures, status.last_error, follower.latest.value))
        return script.handle(request)

    with caplog.at_level(logging.INFO, logger="rgpu_runtime"):
        async with http_client(
            base_url="http://peer", timeout=5.0, transport=httpx.MockTransport(handle)
        ) as http:
            follower = make_follower(http, pace, taken)
            async with anyio.create_task_group() as tg:
                await tg.start(follower.run)
                await eventually(lambda: len(script.requests) >= 8)
                tg.cancel_scope.cancel()
    up, failures, error, value = during[0]
    assert (up, failures, value) == (False, 5, Thing(revision=1))
    assert "connection refused" in error
    assert follower.status.up
    assert follower.status.last_error == ""
    for pause, ceiling in zip(pace.pauses, (0.1, 0.2, 0.4, 0.4, 0.4), strict=False):
        assert ceiling / 2 <= pause <= ceiling
    assert "since" not in script.requests[6].url.params
    assert taken == [Thing(revision=1)]
    messages = [record.getMessage() for record in caplog.records]
    assert sum("failed" in m for m in messages) == 1
    assert sum("is back" in m for m in messages) == 1


async def test_an_older_revision_is_never_taken_and_the_next_call_asks_from_the_held_one(
    pace: Pace,
) -> None:
    script = Script([Thing(revision=5), Thing(revision=3), Thing(revision=3), Thing(revision=6)])
    taken: list[Thing] = []
    async with following(httpx.MockTransport(script.handle), pace, taken):
        await eventually(lambda: len(taken) == 2)
    assert [thing.revision for thing in taken] == [5, 6]
    assert [r.url.params.get("since") for r in script.requests[1:4]] == ["5", "5", "5"]


async def test_a_peer_below_for_the_behind_limit_is_believed_with_a_warning(
    pace: Pace, caplog: pytest.LogCaptureFixture
) -> None:
    script = Script([Thing(revision=5), Thing(revision=2)])
    taken: list[Thing] = []
    with caplog.at_level(logging.WARNING):
        async with following(httpx.MockTransport(script.handle), pace, taken):
            await eventually(lambda: len(taken) == 2)
    assert [thing.revision for thing in taken] == [5, 2]
    assert pace.now >= POLICY.behind_limit_seconds
    assert any("stayed below revision 5" in record.getMessage() for record in caplog.records)


async def test_a_replica_behind_answering_in_turn_with_the_followed_one_is_never_taken(
    pace: Pace,
) -> None:
    behind, ahead = Thing(revision=3), Thing(revision=5)
    script = Script([ahead, behind, ahead, behind, ahead, behind, Thing(revision=6)])
    taken: list[Thing] = []
    async with following(httpx.MockTransport(script.handle), pace, taken):
        await eventually(lambda: len(taken) == 2)
    assert [thing.revision for thing in taken] == [5, 6]


async def test_after_a_failure_an_older_revision_is_not_taken_either(pace: Pace) -> None:
    script = Script([Thing(revision=5), refused(), Thing(revision=2), Thing(revision=7)])
    taken: list[Thing] = []
    async with following(httpx.MockTransport(script.handle), pace, taken):
        await eventually(lambda: len(taken) == 2)
    assert [thing.revision for thing in taken] == [5, 7]


def _answers() -> Iterator[tuple[Callable[[httpx.Request], httpx.Response], type[Exception], str]]:
    def status(code: int) -> Callable[[httpx.Request], httpx.Response]:
        return lambda request: httpx.Response(code, json={"code": "x", "message": "said no"})

    def body(content: bytes) -> Callable[[httpx.Request], httpx.Response]:
        return lambda request: httpx.Response(200, content=content)

    def fail(request: httpx.Request) -> httpx.Response:
        raise refused()

    yield fail, Unavailable, "connection refused"
    yield status(503), Unavailable, "503"
    yield status(429), Unavailable, "429"
    yield status(404), UpstreamError, "404"
    yield body(b"<html>"), UpstreamError, "not JSON"
    yield body(b'{"revision": "x"}'), UpstreamError, "off-contract"


@pytest.mark.parametrize(("handler", "error", "says"), list(_answers()))
async def test_a_failed_call_is_one_of_our_errors_caused_by_the_library_one(
    pace: Pace,
    handler: Callable[[httpx.Request], httpx.Response],
    error: type[Exception],
    says: str,
) -> None:
    transport = httpx.MockTransport(handler)
    async with http_client(base_url="http://peer", timeout=5.0, transport=transport) as http:
        follower = make_follower(http, pace, [])
        with pytest.raises(error, match=says) as caught:
            await follower.poll_once()
    assert type(caught.value) is error
    assert follower.status.last_error == ""  # poll_once raises; run records it


async def test_a_peer_that_never_answers_is_unavailable_after_the_margin(pace: Pace) -> None:
    async def silent(request: httpx.Request) -> httpx.Response:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    policy = FollowPolicy(margin_seconds=0.02)
    transport = httpx.MockTransport(silent)
    async with http_client(base_url="http://peer", timeout=5.0, transport=transport) as http:
        follower = Follower(http, Mirror(THINGS, name="peer"), policy=policy)
        with pytest.raises(Unavailable, match=r"did not answer within 0\.02 s") as caught:
            await follower.poll_once()
    assert isinstance(caught.value.__cause__, TimeoutError)


async def test_age_counts_from_the_last_answer_and_is_unknown_before_it(pace: Pace) -> None:
    transport = httpx.MockTransport(Script([Thing(revision=1)]).handle)
    async with httpx.AsyncClient(transport=transport) as http:
        follower = make_follower(http, pace, [])
    assert follower.status.age(100.0) is None
    follower.status.last_success = 90.0
    assert follower.status.age(100.0) == 10.0
    assert follower.status.age(80.0) == 0.0
