"""The follower reading updates (``delta=1``): it applies deltas to the value it holds, asks
for the whole value when a delta does not start from its revision, keeps its value on a
``behind`` answer and asks again from the same revision, and after a failure asks without
holding but still from its revision."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest

from rgpu_contracts import ContractError, UpdateKind
from rgpu_runtime.feeds import Follower, FollowPolicy, Mirror
from rgpu_runtime.feeds._feed import Feed
from rgpu_runtime.feeds._follower import THREAD_MIN_BYTES
from rgpu_runtime.peers import http_client
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

POLICY = FollowPolicy(
    wait_seconds=60.0,
    min_interval_seconds=0.25,
    backoff_initial_seconds=0.1,
    backoff_cap_seconds=0.4,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Names:
    revision: int
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NamesUpdate:
    kind: UpdateKind
    revision: int
    since: int | None
    names: tuple[str, ...]

    @classmethod
    def from_dict(cls, raw: object) -> NamesUpdate:
        if not isinstance(raw, dict):
            raise ContractError("", "expected an object")
        kind = UpdateKind(raw.get("kind", "full"))
        return cls(
            kind=kind,
            revision=raw["revision"],
            since=raw.get("since"),
            names=tuple(raw.get("names", ())),
        )

    def apply(self, held: Names | None) -> Names:
        base = () if self.kind is UpdateKind.FULL or held is None else held.names
        return Names(revision=self.revision, names=(*base, *self.names))


NAMES = Feed(
    path="/v1/names",
    key="names",
    decode=lambda raw: Names(revision=0, names=()),
    updates=NamesUpdate.from_dict,
)


def full(revision: int, *names: str) -> dict[str, object]:
    return {"kind": "full", "revision": revision, "names": list(names)}


def delta(since: int, revision: int, *names: str) -> dict[str, object]:
    return {"kind": "delta", "revision": revision, "since": since, "names": list(names)}


def behind(revision: int, since: int) -> dict[str, object]:
    return {"kind": "behind", "revision": revision, "since": since}


@dataclass(slots=True)
class Script:
    steps: list[dict[str, object] | Exception]
    requests: list[httpx.Request] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.steps[min(len(self.requests), len(self.steps)) - 1]
        if isinstance(step, Exception):
            raise step
        return httpx.Response(200, content=orjson.dumps(step))

    def params(self, index: int) -> dict[str, str]:
        return dict(self.requests[index].url.params)


@dataclass(slots=True)
class Pace:
    now: float = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await anyio.lowlevel.checkpoint()


@asynccontextmanager
async def following(
    script: Script, on_change: Callable[[Names], object]
) -> AsyncIterator[Follower[Names]]:
    pace = Pace()
    transport = httpx.MockTransport(script.handle)
    async with (
        http_client(base_url="http://peer", timeout=5.0, transport=transport) as http,
        anyio.create_task_group() as tg,
    ):
        mirror = Mirror(NAMES, name="peer", on_change=on_change)
        follower = Follower(http, mirror, policy=POLICY, clock=pace.clock, sleep=pace.sleep)
        with anyio.fail_after(5):
            await tg.start(follower.run)
        yield follower
        tg.cancel_scope.cancel()


async def test_deltas_are_applied_to_the_value_held() -> None:
    script = Script([full(3, "a"), delta(3, 5, "b"), delta(5, 9, "c")])
    taken: list[Names] = []
    async with following(script, taken.append):
        await eventually(lambda: len(taken) == 3)
    assert taken[-1] == Names(revision=9, names=("a", "b", "c"))
    assert script.params(0) == {"delta": "1"}
    assert script.params(1) == {"since": "3", "wait": "60", "delta": "1"}
    assert script.params(2)["since"] == "5"


async def test_a_delta_from_another_revision_is_not_applied_and_the_whole_value_is_asked() -> None:
    script = Script([full(3, "a"), delta(4, 6, "x"), full(7, "a", "y")])
    taken: list[Names] = []
    async with following(script, taken.append):
        await eventually(lambda: len(taken) == 2)
    assert taken == [Names(revision=3, names=("a",)), Names(revision=7, names=("a", "y"))]
    assert script.params(2) == {"delta": "1"}


async def test_a_behind_answer_keeps_the_value_and_asks_again_from_the_same_revision() -> None:
    script = Script([full(5, "a"), behind(4, 5), behind(4, 5), delta(5, 6, "b")])
    taken: list[Names] = []
    async with following(script, taken.append):
        await eventually(lambda: len(taken) == 2)
    assert [names.revision for names in taken] == [5, 6]
    assert [script.params(i)["since"] for i in (1, 2, 3)] == ["5", "5", "5"]


async def test_after_a_failure_it_asks_from_its_revision_without_holding() -> None:
    script = Script([full(5, "a"), httpx.ConnectError("refused"), delta(5, 8, "b")])
    taken: list[Names] = []
    async with following(script, taken.append):
        await eventually(lambda: len(taken) == 2)
    assert script.params(2) == {"since": "5", "wait": "0", "delta": "1"}
    assert taken[-1] == Names(revision=8, names=("a", "b"))


async def test_an_older_full_answer_from_a_replica_behind_is_not_taken() -> None:
    script = Script([full(5, "a"), full(4, "old"), full(6, "a", "b")])
    taken: list[Names] = []
    async with following(script, taken.append):
        await eventually(lambda: len(taken) == 2)
    assert [names.revision for names in taken] == [5, 6]


async def test_a_large_answer_is_decoded_off_the_loop_but_taken_on_it() -> None:
    many = [f"server-{i:06d}" for i in range(8000)]
    script = Script([full(5, *many), delta(5, 6, "more")])
    threads: list[int] = []
    taken: list[Names] = []

    def took(names: Names) -> None:
        threads.append(threading.get_ident())
        taken.append(names)

    async with following(script, took):
        await eventually(lambda: len(taken) == 2)
    assert len(orjson.dumps(full(5, *many))) >= THREAD_MIN_BYTES
    assert threads == [threading.get_ident()] * 2
    assert taken[-1].names[-1] == "more"
