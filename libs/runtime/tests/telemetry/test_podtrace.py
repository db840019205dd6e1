"""A pod's creation travels in its annotation; later steps link to it and name the pod by
OpenTelemetry's Kubernetes conventions."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rgpu_contracts import PodRef, PodUID
from rgpu_runtime.telemetry import (
    CREATION_LINK,
    TRACE_ANNOTATION,
    PodCreations,
    creation_context,
    creation_of,
    link_creation,
    pod_attributes,
    pod_span,
    traceparent_of,
)

POD = PodRef(uid=PodUID("6f1b"), namespace="ml-team", name="trainer-0")


def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_the_creation_round_trips_through_the_annotation() -> None:
    provider, _ = tracing()
    with provider.get_tracer("t").start_as_current_span("extender.mutate") as span:
        value = traceparent_of(span)
    assert value is not None
    pod = {"metadata": {"annotations": {TRACE_ANNOTATION: value}}}
    found = creation_of(pod)
    assert found is not None and found.is_remote
    assert (found.trace_id, found.span_id) == (
        span.get_span_context().trace_id,
        span.get_span_context().span_id,
    )


def test_an_unreadable_or_absent_creation_is_ignored() -> None:
    zero_trace = "00-" + "0" * 32 + "-" + "1" * 16 + "-01"
    for value in (None, 7, "", "00-zz-yy-01", zero_trace, "x" * 5000):
        assert creation_context(value) is None
    assert creation_of({}) is None
    assert creation_of({"metadata": {"annotations": "not a map"}}) is None
    assert creation_of({"metadata": []}) is None


def test_pod_attributes_follow_the_conventions_and_leave_out_what_is_unknown() -> None:
    assert pod_attributes(namespace="ml", name="p", uid="u") == {
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "p",
        "k8s.pod.uid": "u",
    }
    unborn = pod_attributes(namespace="ml", name="p")
    assert unborn == {"k8s.namespace.name": "ml", "k8s.pod.name": "p"}


def test_a_pod_span_starts_its_own_trace_linked_to_the_creation() -> None:
    provider, exporter = tracing()
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("extender.mutate") as creation:
        pass
    with (
        tracer.start_as_current_span("unrelated loop") as loop,
        pod_span(tracer, "allocator.admit", POD, creation=creation.get_span_context()),
        tracer.start_as_current_span("PUT leases"),
    ):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    admit = spans["allocator.admit"]
    assert admit.parent is None
    assert admit.context.trace_id not in (creation.context.trace_id, loop.context.trace_id)
    assert admit.attributes == pod_attributes(namespace="ml-team", name="trainer-0", uid="6f1b")
    (link,) = admit.links
    assert link.context.span_id == creation.context.span_id
    assert dict(link.attributes or {}) == CREATION_LINK
    assert spans["PUT leases"].parent.span_id == admit.context.span_id


def test_a_link_is_added_to_a_running_span_only_when_the_creation_is_known() -> None:
    provider, exporter = tracing()
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("creation") as creation:
        pass
    with tracer.start_as_current_span("POST /filter") as span:
        link_creation(span, creation.get_span_context())
        link_creation(span, None)
    (filtered,) = [s for s in exporter.get_finished_spans() if s.name == "POST /filter"]
    assert [link.context.span_id for link in filtered.links] == [creation.context.span_id]


def test_creations_are_remembered_by_uid_and_the_oldest_forgotten() -> None:
    provider, _ = tracing()
    with provider.get_tracer("t").start_as_current_span("c") as span:
        context = span.get_span_context()
    creations = PodCreations(limit=2)
    for uid in ("a", "b", "c"):
        creations.remember(uid, context)
    creations.remember("d", None)
    creations.remember("", context)
    assert creations.get("a") is None
    assert creations.get("c") == context
    assert creations.get("d") is None
