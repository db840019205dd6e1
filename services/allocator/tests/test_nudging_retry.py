"""A capacity event that finds every waiting pod in its cool-down is not lost: the leader
nudges the first one as soon as it may, without waiting for another event (on the simulated
apiserver, through the allocator's real Kubernetes calls)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

import rgpu_testkit
from rgpu_allocator.annotations import ANNOTATION_RETRY_AT
from rgpu_allocator.clients import KubeApi
from rgpu_allocator.nudging import Nudger
from rgpu_allocator.settings import AllocatorSettings
from rgpu_allocator.waiters import COOL_DOWN, Refused, Waiting
from rgpu_contracts import PodRef, PodUID
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_runtime.kube import EventRecorder, kube_client
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api() -> AsyncIterator[tuple[SimApiServer, KubeApi]]:
    async with run_apiserver() as sim:
        sim.store.create("namespaces", {"metadata": {"name": "ml"}})
        sim.store.create("pods", rgpu_testkit.pod_manifest(name="trainer-0", namespace="ml"))
        settings = AllocatorSettings.from_env({"RGPU_KUBE_URL": sim.url})
        async with kube_client(settings) as kube, anyio.create_task_group() as tg:
            events = EventRecorder(component="rgpu-allocator")
            await tg.start(events.run, kube)
            yield sim, KubeApi(kube, namespace="ml", lease_selector="x=y", events=events)
            tg.cancel_scope.cancel()


def stamp(sim: SimApiServer) -> str | None:
    pod = sim.store.get("pods", "trainer-0", namespace="ml")
    return (pod["metadata"].get("annotations") or {}).get(ANNOTATION_RETRY_AT)


def trainer_waiting(sim: SimApiServer) -> tuple[Waiting, PodUID]:
    """The leader's line holding the one pending pod, ``trainer-0``."""
    waiting = Waiting()
    uid = PodUID(sim.store.get("pods", "trainer-0", namespace="ml")["metadata"]["uid"])
    waiting.track(PodRef(uid=uid, namespace="ml", name="trainer-0"), True)
    return waiting, uid


def patches(sim: SimApiServer) -> int:
    """Pod patches the apiserver received, refused ones included."""
    return sum(
        count.requests
        for key, count in sim.meter.snapshot().items()
        if key.verb == "patch" and key.resource == "pods"
    )


async def test_capacity_that_finds_everyone_cooling_nudges_once_the_cool_down_ends(
    api: tuple[SimApiServer, KubeApi],
) -> None:
    sim, kube_api = api
    waiting, uid = trainer_waiting(sim)
    clock = anyio.current_time
    waiting.nudged(uid, clock())  # nudged a moment ago: in its cool-down
    nudged: list[None] = []
    nudger = Nudger(
        kube_api, Refused(), clock=clock, count=lambda: nudged.append(None), waiting=waiting
    )
    async with anyio.create_task_group() as tg:
        await tg.start(nudger.run)
        nudger.notify()  # capacity appears while the only waiting pod cools down
        await anyio.sleep(COOL_DOWN / 4)
        assert stamp(sim) is None
        # The nudge is counted once its patch is answered, which is after the stamp is
        # stored: waiting for the stamp alone could cancel the nudger in between.
        await eventually(lambda: bool(nudged), timeout=5 * COOL_DOWN, what="a nudge")
        tg.cancel_scope.cancel()
    assert stamp(sim) is not None
    assert len(nudged) == 1


async def test_a_nudge_the_apiserver_refused_with_429_is_retried_after_its_retry_after(
    api: tuple[SimApiServer, KubeApi],
) -> None:
    sim, kube_api = api
    waiting, _ = trainer_waiting(sim)
    nudger = Nudger(
        kube_api, Refused(), clock=anyio.current_time, count=lambda: None, waiting=waiting
    )
    sim.faults.set_error(verb="patch", resource="pods", rate=1.0, code=429, retry_after=1)
    async with anyio.create_task_group() as tg:
        await tg.start(nudger.run)
        nudger.notify()  # one capacity event, and no other after it
        await eventually(lambda: patches(sim) > 0, timeout=5, what="the nudge refused")
        sim.faults.clear()
        assert stamp(sim) is None
        await eventually(lambda: stamp(sim) is not None, timeout=5, what="the nudge retried")
        tg.cancel_scope.cancel()


async def test_a_nudge_refused_for_good_is_not_retried(
    api: tuple[SimApiServer, KubeApi],
) -> None:
    sim, kube_api = api
    waiting, _ = trainer_waiting(sim)
    refused = Refused()
    nudger = Nudger(
        kube_api, refused, clock=anyio.current_time, count=lambda: None, waiting=waiting
    )
    sim.faults.set_error(verb="patch", resource="pods", rate=1.0, code=403)
    async with anyio.create_task_group() as tg:
        await tg.start(nudger.run)
        nudger.notify()
        await eventually(lambda: patches(sim) > 0, timeout=5, what="the nudge refused")
        sim.faults.clear()
        await anyio.sleep(COOL_DOWN / 2)
        assert stamp(sim) is None
        assert len(refused) == 0
        tg.cancel_scope.cancel()
