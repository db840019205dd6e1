"""Events: deduplicated within a window, rate-limited, queued without ever blocking the caller,
and written by one background task to the simulated apiserver over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from rgpu_runtime.kube import EventRecorder, KubeClient, KubeEvent, ObjectRef, kube_client
from rgpu_runtime.kube._recorder import event_body
from rgpu_runtime.pacing import TokenBucket
from rgpu_runtime.settings import Settings
from rgpu_testkit import eventually

kubesim = pytest.importorskip("rgpu_kubesim")

pytestmark = pytest.mark.anyio

POD = ObjectRef(kind="Pod", name="trainer-0", namespace="ml-team", uid="uid-1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def event(message: str = "2/4 CardInsufficientMemory", regarding: ObjectRef = POD) -> KubeEvent:
    return KubeEvent(
        regarding=regarding, reason="RemoteGPUUnavailable", message=message, warning=True
    )


@pytest.fixture
def new_recorder() -> Iterator[Callable[..., EventRecorder]]:
    made: list[EventRecorder] = []

    def make(**options: Any) -> EventRecorder:
        options.setdefault("clock", FakeClock())
        made.append(EventRecorder(component="rgpu-test", **options))
        return made[-1]

    yield make
    for recorder in made:
        recorder.close()


def test_a_full_queue_drops_and_counts_without_blocking_or_raising(new_recorder) -> None:
    seen: list[tuple[str, str]] = []
    recorder = new_recorder(capacity=2, on_outcome=lambda e, o: seen.append((e.message, o)))
    for i in range(5):
        recorder.record(event(f"m{i}"))
    assert recorder.counts == {"dropped": 3}
    assert seen == [("m2", "dropped"), ("m3", "dropped"), ("m4", "dropped")]


def test_a_dropped_event_is_not_remembered_so_a_retry_is_queued(new_recorder) -> None:
    recorder = new_recorder(capacity=1)
    recorder.record(event("m0"))
    recorder.record(event("m1"))
    recorder.close()
    recorder.record(event("m1"))
    assert recorder.counts == {"dropped": 2}


def test_a_repeat_within_the_window_is_skipped_and_recorded_again_after_it(
    new_recorder,
) -> None:
    clock = FakeClock()
    recorder = new_recorder(clock=clock, dedup_seconds=60.0)
    recorder.record(event())
    clock.now += 59
    recorder.record(event())
    assert recorder.counts == {"deduplicated": 1}
    clock.now += 2
    recorder.record(event())
    assert recorder.counts == {"deduplicated": 1}


def test_another_message_reason_or_object_is_no_repeat(new_recorder) -> None:
    recorder = new_recorder()
    recorder.record(event())
    recorder.record(event("1/4 CardNotHealth"))
    recorder.record(event(regarding=ObjectRef(kind="Pod", name="b", namespace="a", uid="u2")))
    recorder.record(KubeEvent(regarding=POD, reason="RemoteGPUAllocated", message="x"))
    assert recorder.counts == {}


def test_events_beyond_the_burst_are_rate_limited_until_tokens_refill(new_recorder) -> None:
    clock = FakeClock()
    recorder = new_recorder(clock=clock, bucket=TokenBucket(20.0, burst=2, clock=clock))
    for i in range(3):
        recorder.record(event(f"m{i}"))
    assert recorder.counts == {"rate_limited": 1}
    clock.now += 0.1
    recorder.record(event("m2"))
    assert recorder.counts == {"rate_limited": 1}


def test_an_event_about_an_unnamed_object_is_refused_as_invalid(new_recorder) -> None:
    recorder = new_recorder()
    recorder.record(event(regarding=ObjectRef(kind="Pod", name="", namespace="a")))
    assert recorder.counts == {"invalid": 1}


def test_event_names_stay_within_the_kubernetes_limit_for_long_object_names() -> None:
    long = ObjectRef(kind="Node", name="n" * 253)
    body = event_body(event(regarding=long), component="rgpu-test", instance="pod-7")
    assert len(body["metadata"]["name"]) == 253
    assert body["metadata"]["namespace"] == "default"
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n" * 253}
    assert body["reportingInstance"] == "pod-7"


@asynccontextmanager
async def cluster() -> AsyncIterator[tuple[Any, KubeClient]]:
    async with kubesim.run_apiserver() as sim:
        sim.store.create("namespaces", {"metadata": {"name": "ml-team"}})
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="extender")
        async with kube_client(settings, timeout=2.0) as kube:
            yield sim, kube


async def written(sim: Any, count: int) -> list[dict[str, Any]]:
    await eventually(lambda: len(sim.store.list("events", namespace="ml-team")) >= count)
    return list(sim.store.list("events", namespace="ml-team"))


async def test_queued_events_are_written_as_core_v1_events() -> None:
    recorder = EventRecorder(component="rgpu-scheduler")
    async with cluster() as (sim, kube), anyio.create_task_group() as tg:
        await tg.start(recorder.run, kube)
        recorder.record(event())
        (found,) = await written(sim, 1)
        # The store holds the Event before the writer's call has returned and counted it.
        await eventually(lambda: recorder.counts.get("written"))
        tg.cancel_scope.cancel()
    assert found["reason"] == "RemoteGPUUnavailable"
    assert found["type"] == "Warning"
    assert found["message"] == "2/4 CardInsufficientMemory"
    assert found["source"] == {"component": "rgpu-scheduler"}
    assert found["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "trainer-0",
        "namespace": "ml-team",
        "uid": "uid-1",
    }
    assert recorder.counts == {"written": 1}


async def test_a_failed_write_is_counted_forgotten_and_the_writer_carries_on() -> None:
    recorder = EventRecorder(component="rgpu-scheduler")
    async with cluster() as (sim, kube), anyio.create_task_group() as tg:
        sim.faults.set_error(verb="create", resource="events", rate=1.0, code=500)
        await tg.start(recorder.run, kube)
        recorder.record(event("first"))
        await eventually(lambda: recorder.counts.get("failed"))
        sim.faults.clear()
        recorder.record(event("first"))
        (only,) = await written(sim, 1)
        tg.cancel_scope.cancel()
    assert only["message"] == "first"
    assert recorder.counts == {"failed": 1, "written": 1}


@pytest.fixture
def global_spans() -> Iterator[Any]:
    """Spans of the process' provider (set once per process; another module may have)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    exporter.shutdown()


async def test_an_event_is_written_under_the_span_it_was_recorded_in(global_spans) -> None:
    provider, exporter = global_spans
    recorder = EventRecorder(component="rgpu-scheduler")
    async with cluster() as (sim, kube), anyio.create_task_group() as tg:
        await tg.start(recorder.run, kube)
        with provider.get_tracer("test").start_as_current_span("extender.filter") as decision:
            recorder.record(event())
        await written(sim, 1)
        tg.cancel_scope.cancel()
    (write,) = [s for s in exporter.get_finished_spans() if s.name == "POST events"]
    assert write.parent is not None
    assert write.parent.span_id == decision.get_span_context().span_id
    assert write.context.trace_id == decision.get_span_context().trace_id
