"""The reflector against the simulated apiserver over real HTTP: list, watch, bookmarks,
410 relist by diff, backoff on errors and a stalled watch reopened."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from rgpu_runtime.kube import (
    KubeClient,
    Listing,
    ObjectChange,
    Reflector,
    ReflectorTiming,
    WatchEvent,
    WatchTrouble,
    kube_client,
    kube_pages,
)
from rgpu_runtime.pacing import Backoff
from rgpu_runtime.settings import Settings
from rgpu_testkit import eventually, pod_manifest

kubesim = pytest.importorskip("rgpu_kubesim")

pytestmark = pytest.mark.anyio

QUICK = Backoff(initial=0.01, maximum=0.05)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str, namespace: str = "team-a") -> dict[str, Any]:
    return pod_manifest(name=name, namespace=namespace)


def name_of(obj: dict[str, Any]) -> str | None:
    return str(obj["metadata"]["name"])


class Followed:
    """A reflector over the pods of ``team-a``, with what it reported and what it asked."""

    def __init__(self, kube: KubeClient, *, timing: ReflectorTiming, clock: FakeClock) -> None:
        self.changes: list[tuple[str, str]] = []
        self.troubles: list[WatchTrouble] = []
        self.watched_from: list[str] = []
        self.lists = 0
        self._kube = kube
        self.reflector = Reflector[str](
            name="pods",
            list_pages=self._pages,
            watch=self._watch,
            transform=name_of,
            on_change=self._changed,
            on_trouble=self.troubles.append,
            timing=timing,
            clock=clock,
        )

    def _pages(self) -> AsyncIterator[Listing]:
        self.lists += 1
        return kube_pages(self._kube, self._kube.core.list_namespaced_pod, "team-a", page_size=2)

    def _watch(self, version: str) -> AsyncIterator[WatchEvent]:
        self.watched_from.append(version)
        core = self._kube.core
        return self._kube.watch(
            core.list_namespaced_pod, "team-a", resource_version=version, backoff=QUICK
        )

    def _changed(self, change: ObjectChange[str]) -> None:
        name = change.after if change.after is not None else change.before
        self.changes.append((change.type, str(name)))


@asynccontextmanager
async def following(
    sim: Any, *, stall: float = 3600.0, clock: FakeClock | None = None
) -> AsyncIterator[Followed]:
    settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="allocator")
    timing = ReflectorTiming(backoff=QUICK, stall_seconds=stall, stall_check_seconds=0.005)
    async with kube_client(settings, timeout=2.0) as kube, anyio.create_task_group() as tg:
        followed = Followed(kube, timing=timing, clock=clock or FakeClock())
        await tg.start(followed.reflector.run)
        yield followed
        tg.cancel_scope.cancel()


@asynccontextmanager
async def apiserver(bookmarks: float = 3600.0) -> AsyncIterator[Any]:
    options = kubesim.ApiOptions(bookmark_interval_seconds=bookmarks)
    async with kubesim.run_apiserver(options=options) as sim:
        for namespace in ("team-a", "team-b"):
            sim.store.create("namespaces", {"metadata": {"name": namespace}})
        yield sim


async def test_the_first_list_is_in_the_cache_when_the_reflector_reports_started() -> None:
    async with apiserver() as sim:
        for name in ("p-0", "p-1", "p-2"):
            sim.store.create("pods", pod(name), namespace="team-a")
        sim.store.create("pods", pod("elsewhere", "team-b"), namespace="team-b")
        async with following(sim) as followed:
            reflector = followed.reflector
            assert reflector.synced
            assert sorted(reflector.values.values()) == ["p-0", "p-1", "p-2"]
            assert sorted(followed.changes) == [
                ("ADDED", "p-0"),
                ("ADDED", "p-1"),
                ("ADDED", "p-2"),
            ]


async def test_watched_adds_updates_and_deletes_reach_the_consumer_in_order() -> None:
    async with apiserver() as sim:
        sim.store.create("pods", pod("p-0"), namespace="team-a")
        async with following(sim) as followed:
            sim.store.create("pods", pod("p-1"), namespace="team-a")
            sim.store.patch("pods", "p-0", {"metadata": {"labels": {"a": "b"}}}, namespace="team-a")
            sim.store.delete("pods", "p-1", namespace="team-a")
            await eventually(lambda: len(followed.changes) == 4)
            assert followed.changes[1:] == [
                ("ADDED", "p-1"),
                ("MODIFIED", "p-0"),
                ("DELETED", "p-1"),
            ]
            assert list(followed.reflector.values.values()) == ["p-0"]
            assert followed.reflector.resource_version == str(sim.store.resource_version)


async def test_after_410_the_relist_reports_only_what_was_missed_as_a_diff() -> None:
    async with apiserver() as sim:
        for name in ("gone", "changed", "same"):
            sim.store.create("pods", pod(name), namespace="team-a")
        async with following(sim) as followed:
            sim.faults.set_error(verb="watch", resource="pods", rate=1.0, code=500)
            sim.faults.cut_watches()
            await eventually(lambda: bool(followed.troubles))
            sim.store.delete("pods", "gone", namespace="team-a")
            sim.store.patch(
                "pods", "changed", {"metadata": {"labels": {"x": "y"}}}, namespace="team-a"
            )
            sim.store.create("pods", pod("new"), namespace="team-a")
            sim.faults.expire_before()
            sim.faults.clear()
            await eventually(lambda: followed.lists == 2 and len(followed.changes) == 6)
            assert sorted(followed.changes[3:]) == [
                ("ADDED", "new"),
                ("DELETED", "gone"),
                ("MODIFIED", "changed"),
            ]
            assert sorted(followed.reflector.values.values()) == ["changed", "new", "same"]
            reasons = {(t.reason, t.phase) for t in followed.troubles}
            assert ("expired", "watch") in reasons
            assert ("error", "watch") in reasons


async def test_a_bookmark_moves_the_resume_point_so_a_cut_watch_needs_no_relist() -> None:
    async with apiserver(bookmarks=0.02) as sim:
        sim.store.create("pods", pod("p-0"), namespace="team-a")
        async with following(sim) as followed:
            listed_at = followed.reflector.resource_version
            # Changes elsewhere move the global version; only a bookmark tells this watch.
            sim.store.create("pods", pod("other", "team-b"), namespace="team-b")
            target = str(sim.store.resource_version)
            await eventually(lambda: followed.reflector.resource_version == target)
            assert followed.changes == [("ADDED", "p-0")]
            sim.faults.expire_before(int(target))
            sim.faults.cut_watches()
            sim.store.create("pods", pod("p-1"), namespace="team-a")
            await eventually(lambda: ("ADDED", "p-1") in followed.changes)
            assert followed.lists == 1
            assert int(target) > int(listed_at)


async def test_a_watch_silent_beyond_the_stall_limit_is_reopened_from_its_version() -> None:
    clock = FakeClock()
    async with apiserver() as sim:
        sim.store.create("pods", pod("p-0"), namespace="team-a")
        async with following(sim, stall=60.0, clock=clock) as followed:
            await eventually(lambda: len(followed.watched_from) == 1)
            version = followed.reflector.resource_version
            clock.now += 61
            await eventually(lambda: len(followed.watched_from) == 2)
            assert followed.watched_from == [version, version]
            assert [t.reason for t in followed.troubles] == ["stalled"]
            assert followed.lists == 1
            sim.store.create("pods", pod("p-1"), namespace="team-a")
            await eventually(lambda: ("ADDED", "p-1") in followed.changes)


async def test_the_cache_age_grows_with_silence_and_resets_on_news() -> None:
    clock = FakeClock()
    async with apiserver() as sim, following(sim, clock=clock) as followed:
        reflector = followed.reflector
        assert reflector.age() == 0.0
        clock.now += 30
        assert reflector.age() == 30.0
        assert not reflector.fresh(within=10.0)
        sim.store.create("pods", pod("p-0"), namespace="team-a")
        await eventually(lambda: reflector.age() == 0.0)
        assert reflector.fresh(within=10.0)


async def test_before_the_first_list_the_cache_is_infinitely_old_and_failures_back_off() -> None:
    async with apiserver() as sim:
        sim.faults.set_error(verb="list", resource="pods", rate=1.0, code=503)
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="allocator")
        timing = ReflectorTiming(backoff=QUICK)
        async with kube_client(settings, timeout=2.0) as kube, anyio.create_task_group() as tg:
            followed = Followed(kube, timing=timing, clock=FakeClock())
            synced = anyio.Event()

            async def start() -> None:
                await tg.start(followed.reflector.run)
                synced.set()

            tg.start_soon(start)
            await eventually(lambda: len(followed.troubles) >= 2)
            assert math.isinf(followed.reflector.age())
            assert not synced.is_set()
            assert {(t.reason, t.phase) for t in followed.troubles} == {("error", "list")}
            sim.faults.clear()
            await eventually(synced.is_set)
            tg.cancel_scope.cancel()


async def test_a_consumer_that_swaps_whole_lists_gets_each_relist_as_one_diff() -> None:
    batches: list[tuple[list[tuple[str, str | None]], list[str]]] = []

    def relisted(changes: Sequence[ObjectChange[str]], values: Mapping[str, str]) -> None:
        diff = [(c.type, c.after or c.before) for c in changes]
        batches.append((sorted(diff, key=str), sorted(values.values())))

    async with apiserver() as sim:
        sim.store.create("pods", pod("p-0"), namespace="team-a")
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="allocator")
        async with kube_client(settings, timeout=2.0) as kube, anyio.create_task_group() as tg:
            followed = Followed(kube, timing=ReflectorTiming(backoff=QUICK), clock=FakeClock())
            reflector = Reflector[str](
                name="pods",
                list_pages=followed._pages,
                watch=followed._watch,
                transform=name_of,
                on_change=followed._changed,
                on_relist=relisted,
            )
            await tg.start(reflector.run)
            sim.faults.set_error(verb="watch", resource="pods", rate=1.0, code=500)
            sim.faults.cut_watches()
            sim.store.create("pods", pod("p-1"), namespace="team-a")
            sim.faults.expire_before()
            sim.faults.clear()
            await eventually(lambda: len(batches) == 2)
            tg.cancel_scope.cancel()
    assert batches == [
        ([("ADDED", "p-0")], ["p-0"]),
        ([("ADDED", "p-1")], ["p-0", "p-1"]),
    ]
    assert followed.changes == []
