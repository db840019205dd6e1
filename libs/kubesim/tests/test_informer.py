"""The emulators' list+watch cache against the simulated apiserver, including its faults."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from rgpu_kubesim import RequestKey, SimApiServer
from rgpu_kubesim._informer import Informer, InformerTiming, KubeHttp
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

AGENT = "informer-test/1"


@dataclass
class Seen:
    """Handler events as ``(type, name, label before, label now)`` plus request counts."""

    sim: SimApiServer
    events: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)

    def handler(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        before = None if old is None else (old["metadata"].get("labels") or {}).get("v")
        now = (obj["metadata"].get("labels") or {}).get("v")
        self.events.append((kind, obj["metadata"]["name"], before, now))

    def requests(self, verb: str) -> int:
        """The informer's list or watch requests so far, as the apiserver counted them."""
        tally = self.sim.meter.snapshot()
        key = RequestKey(client=AGENT.split("/")[0], verb=verb, resource="nodes")
        return tally[key].requests if key in tally else 0


@pytest.fixture
def seen(sim: SimApiServer) -> Seen:
    return Seen(sim)


Run = Callable[[], contextlib.AbstractAsyncContextManager[Informer]]


@pytest.fixture
def informer(sim: SimApiServer, seen: Seen) -> Run:
    @contextlib.asynccontextmanager
    async def run() -> AsyncIterator[Informer]:
        async with (
            KubeHttp(sim.url, user_agent=AGENT) as api,
            anyio.create_task_group() as tg,
        ):
            cache = Informer(api, "/api/v1/nodes", seen.handler)
            await tg.start(cache.run)
            yield cache
            tg.cancel_scope.cancel()

    return run


def add_node(sim: SimApiServer, name: str, version: str = "1") -> None:
    sim.store.create("nodes", {"metadata": {"name": name, "labels": {"v": version}}})


def relabel(sim: SimApiServer, name: str, version: str) -> None:
    sim.store.patch("nodes", name, {"metadata": {"labels": {"v": version}}})


async def test_list_then_watch_delivers_each_change_with_the_previous_state(
    sim: SimApiServer, seen: Seen, informer: Run
) -> None:
    add_node(sim, "a")
    async with informer() as cache:
        relabel(sim, "a", "2")
        add_node(sim, "b")
        sim.store.delete("nodes", "b")
        await eventually(lambda: len(seen.events) == 4)
        assert [o["metadata"]["name"] for o in cache.objects.values()] == ["a"]
    assert seen.events == [
        ("ADDED", "a", None, "1"),
        ("MODIFIED", "a", "1", "2"),
        ("ADDED", "b", None, "1"),
        ("DELETED", "b", None, "1"),
    ]


async def test_a_cut_watch_resumes_from_the_last_version_without_relisting(
    sim: SimApiServer, seen: Seen, informer: Run
) -> None:
    add_node(sim, "a")
    async with informer():
        await eventually(lambda: sim.faults.to_dict()["openWatches"] == 1)
        sim.faults.cut_watches()
        add_node(sim, "b")
        await eventually(lambda: len(seen.events) == 2)
        await anyio.sleep(0.1)
    assert seen.events == [("ADDED", "a", None, "1"), ("ADDED", "b", None, "1")]
    assert seen.requests("list") == 1
    assert seen.requests("watch") >= 2


async def test_an_expired_version_relists_and_reports_only_what_changed_meanwhile(
    sim: SimApiServer, seen: Seen, informer: Run
) -> None:
    for name in ("a", "b", "d"):
        add_node(sim, name)
    async with informer() as cache:
        sim.faults.set_latency(verb="watch", resource="nodes", seconds=0.3)
        sim.faults.cut_watches()
        relabel(sim, "a", "2")
        sim.store.delete("nodes", "b")
        add_node(sim, "c")
        sim.faults.expire_before()
        await eventually(lambda: len(seen.events) == 6)
        sim.faults.clear()
        assert sorted(o["metadata"]["name"] for o in cache.objects.values()) == ["a", "c", "d"]
    assert seen.requests("list") == 2
    assert seen.events[3:] == [
        ("DELETED", "b", None, "1"),
        ("MODIFIED", "a", "1", "2"),
        ("ADDED", "c", None, "1"),
    ]


async def test_a_failing_watch_backs_off_instead_of_spinning(
    sim: SimApiServer, seen: Seen, informer: Run
) -> None:
    add_node(sim, "a")
    async with informer():
        sim.faults.set_error(verb="watch", rate=1.0, code=500)
        sim.faults.cut_watches()
        before = seen.requests("watch")
        await anyio.sleep(0.5)
        failing = seen.requests("watch") - before
        sim.faults.clear()
        add_node(sim, "b")
        await eventually(lambda: ("ADDED", "b", None, "1") in seen.events)
    assert 2 <= failing <= 5, "0.1 s doubling allows 3 attempts in half a second"


async def test_watches_cut_before_any_event_back_off_instead_of_spinning(
    sim: SimApiServer, seen: Seen, informer: Run
) -> None:
    add_node(sim, "a")
    async with informer():
        before = seen.requests("watch")
        with anyio.move_on_after(0.4):
            while True:
                sim.faults.cut_watches()
                await anyio.sleep(0.01)
        rewatches = seen.requests("watch") - before
        add_node(sim, "b")
        await eventually(lambda: ("ADDED", "b", None, "1") in seen.events)
    assert rewatches <= 8, f"{rewatches} watches in 0.4 s: the informer spins"


async def test_start_waits_for_a_successful_list_and_retries_with_backoff(
    sim: SimApiServer, seen: Seen, informer: Run
) -> None:
    add_node(sim, "a")
    sim.faults.set_error(verb="list", resource="nodes", rate=1.0, code=503)
    started = anyio.Event()

    async def start() -> None:
        async with informer():
            started.set()
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(start)
        await anyio.sleep(0.3)
        assert not started.is_set()
        assert 2 <= seen.requests("list") <= 4
        sim.faults.clear()
        with anyio.fail_after(5):
            await started.wait()
        tg.cancel_scope.cancel()
    assert seen.events == [("ADDED", "a", None, "1")]


async def test_field_selector_turns_leaving_objects_into_deletions(
    sim: SimApiServer,
) -> None:
    events: list[tuple[str, str]] = []
    api = KubeHttp(sim.url, user_agent=AGENT)
    cache = Informer(
        api,
        "/api/v1/nodes",
        lambda kind, obj, old: events.append((kind, obj["metadata"]["name"])),
        field_selector="spec.unschedulable!=true",
        timing=InformerTiming(initial_backoff_seconds=0.01),
    )
    add_node(sim, "a")
    async with api, anyio.create_task_group() as tg:
        await tg.start(cache.run)
        sim.store.patch("nodes", "a", {"spec": {"unschedulable": True}})
        await eventually(lambda: len(events) == 2)
        tg.cancel_scope.cancel()
    assert events == [("ADDED", "a"), ("DELETED", "a")]
    assert cache.objects == {}


async def test_a_watch_event_larger_than_aiohttps_line_limit_arrives_whole(
    sim: SimApiServer, seen: Seen, informer: Run
) -> None:
    big = "x" * 200_000
    async with informer() as cache:
        sim.store.create("nodes", {"metadata": {"name": "a", "annotations": {"note": big}}})
        relabel(sim, "a", "2")
        await eventually(lambda: len(seen.events) == 2)
        [node] = cache.objects.values()
    assert node["metadata"]["annotations"]["note"] == big
    assert seen.requests("list") == 1
