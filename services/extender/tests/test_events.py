"""Pod events: the extender's outcomes reach the apiserver as core/v1 Events about the pod, and
every fate an event meets is counted by reason in the extender's metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from rgpu_contracts import PodRef, PodUID
from rgpu_extender.events import UNAVAILABLE, event_recorder, pod_event
from rgpu_extender.instruments import ExtenderMetrics
from rgpu_runtime.kube import KubeClient, KubeEvent, kube_client
from rgpu_runtime.pacing import TokenBucket

pytestmark = pytest.mark.anyio

POD = PodRef(uid=PodUID("uid-1"), namespace="ml-team", name="trainer-0")


def event(message: str = "2/4 CardInsufficientMemory", pod: PodRef = POD) -> KubeEvent:
    return pod_event(pod=pod, reason=UNAVAILABLE, message=message, warning=True)


class Recorded:
    """A recorder with its own registry; closed by the ``new_recorder`` fixture."""

    def __init__(self, **options: Any) -> None:
        self.registry = CollectorRegistry()
        self.recorder = event_recorder(
            component="rgpu-scheduler", metrics=ExtenderMetrics.create(self.registry), **options
        )

    def count(self, result: str) -> float:
        labels = {"reason": UNAVAILABLE, "result": result}
        return self.registry.get_sample_value("rgpu_extender_events_total", labels) or 0.0


@pytest.fixture
def new_recorder() -> Iterator[Callable[..., Recorded]]:
    made: list[Recorded] = []

    def make(**options: Any) -> Recorded:
        made.append(Recorded(**options))
        return made[-1]

    yield make
    for one in made:
        one.recorder.close()


@pytest.fixture
async def kube(sim, build) -> AsyncIterator[KubeClient]:
    async with kube_client(build.settings(RGPU_KUBE_URL=sim.url)) as client:
        yield client


async def written(sim, count: int) -> list[dict[str, Any]]:
    with anyio.fail_after(5):
        while len(found := sim.store.list("events", namespace="ml-team")) < count:
            await anyio.sleep(0.01)
    return list(found)


def test_a_repeated_outcome_for_the_same_pod_is_counted_as_deduplicated(new_recorder) -> None:
    recorded = new_recorder()
    recorded.recorder.record(event())
    recorded.recorder.record(event())
    assert recorded.count("deduplicated") == 1


def test_a_changed_message_or_another_pod_is_recorded_again(new_recorder) -> None:
    recorded = new_recorder()
    recorded.recorder.record(event())
    recorded.recorder.record(event("1/4 CardNotHealth"))
    recorded.recorder.record(event(pod=PodRef(uid=PodUID("u2"), namespace="a", name="b")))
    assert recorded.count("deduplicated") == 0


def test_events_beyond_the_burst_are_counted_as_rate_limited(new_recorder) -> None:
    recorded = new_recorder(bucket=TokenBucket(1.0, burst=2, clock=lambda: 0.0))
    for i in range(3):
        recorded.recorder.record(event(f"m{i}"))
    assert recorded.count("rate_limited") == 1


def test_a_full_queue_drops_without_blocking(new_recorder) -> None:
    recorded = new_recorder(capacity=1)
    recorded.recorder.record(event("m0"))
    recorded.recorder.record(event("m1"))
    assert recorded.count("dropped") == 1


def test_a_pod_without_a_name_gets_no_event(new_recorder) -> None:
    recorded = new_recorder()
    recorded.recorder.record(event(pod=PodRef(uid=PodUID("u"), namespace="a", name="")))
    assert recorded.count("invalid") == 1


async def test_queued_events_are_written_as_core_v1_events(sim, kube) -> None:
    recorded = Recorded()
    async with anyio.create_task_group() as tg:
        await tg.start(recorded.recorder.run, kube)
        recorded.recorder.record(event())
        (written_event,) = await written(sim, 1)
        # The apiserver stores the Event before it answers; the recorder counts it on the answer.
        with anyio.fail_after(5):
            while recorded.count("written") < 1:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert written_event["reason"] == UNAVAILABLE
    assert written_event["type"] == "Warning"
    assert written_event["message"] == "2/4 CardInsufficientMemory"
    assert written_event["source"] == {"component": "rgpu-scheduler"}
    assert written_event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "trainer-0",
        "namespace": "ml-team",
        "uid": "uid-1",
    }
    assert recorded.count("written") == 1


async def test_a_failed_write_is_counted_and_the_writer_carries_on(sim, kube) -> None:
    recorded = Recorded()
    sim.faults.set_error(verb="create", resource="events", rate=1.0, code=500)
    async with anyio.create_task_group() as tg:
        await tg.start(recorded.recorder.run, kube)
        recorded.recorder.record(event("first"))
        with anyio.fail_after(5):
            while not recorded.count("failed"):
                await anyio.sleep(0.01)
        sim.faults.clear()
        recorded.recorder.record(event("second"))
        (only,) = await written(sim, 1)
        tg.cancel_scope.cancel()
    assert only["message"] == "second"
