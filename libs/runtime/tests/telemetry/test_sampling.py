"""Request traces follow the standard sampler; background traces are thinned at their root,
and a trace is kept or dropped whole."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind

from rgpu_contracts import PodRef, PodUID
from rgpu_runtime.settings import TraceSettings
from rgpu_runtime.telemetry import pod_span
from rgpu_runtime.telemetry._sampling import trace_sampler

ROOTS = 2000


def provider(**settings: object) -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    sampler = trace_sampler(TraceSettings(**settings))  # type: ignore[arg-type]
    tracer_provider = TracerProvider(sampler=sampler)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider.get_tracer("test"), exporter


def kept(exporter: InMemorySpanExporter) -> int:
    return len(exporter.get_finished_spans())


def test_background_roots_are_kept_at_their_ratio_and_requests_all() -> None:
    tracer, exporter = provider(background_ratio=0.1)
    for _ in range(ROOTS):
        with tracer.start_as_current_span("discovery.lupine.probe"):
            pass
    background = kept(exporter)
    exporter.clear()
    for _ in range(ROOTS):
        with tracer.start_as_current_span("POST /filter", kind=SpanKind.SERVER):
            pass
    assert 0.05 * ROOTS < background < 0.15 * ROOTS
    assert kept(exporter) == ROOTS


def test_work_for_a_pod_counts_as_a_request_whether_linked_or_named() -> None:
    tracer, exporter = provider(background_ratio=0.0)
    pod = PodRef(uid=PodUID("u-1"), namespace="ml", name="p")
    with tracer.start_as_current_span("creation", kind=SpanKind.SERVER) as creation:
        pass
    with pod_span(tracer, "allocator.admit", pod, creation=creation.get_span_context()):
        pass
    with tracer.start_as_current_span("linked", links=[Link(creation.get_span_context())]):
        pass
    with tracer.start_as_current_span("named", attributes={"k8s.pod.uid": "u-1"}):
        pass
    with tracer.start_as_current_span("PUT leases", kind=SpanKind.CLIENT):
        pass
    names = {span.name for span in exporter.get_finished_spans()}
    assert names == {"creation", "allocator.admit", "linked", "named"}


def test_children_follow_their_root_so_a_trace_is_kept_whole() -> None:
    tracer, exporter = provider(background_ratio=0.5)
    for _ in range(200):
        with (
            tracer.start_as_current_span("sweep"),
            tracer.start_as_current_span("PUT leases", kind=SpanKind.CLIENT),
        ):
            pass
    spans = exporter.get_finished_spans()
    roots = {s.context.trace_id for s in spans if s.parent is None}
    children = {s.context.trace_id for s in spans if s.parent is not None}
    assert roots == children
    assert 0 < len(roots) < 200


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"sampler": "parentbased_always_off"}, 0),
        ({"sampler": "always_off"}, 0),
        ({"sampler": "parentbased_traceidratio", "ratio": 0.0}, 0),
        ({"sampler": "traceidratio", "ratio": 1.0}, ROOTS),
        ({"sampler": "always_on"}, ROOTS),
    ],
    ids=str,
)
def test_the_standard_sampler_decides_requests(settings: dict[str, object], expected: int) -> None:
    tracer, exporter = provider(**settings)
    for _ in range(ROOTS):
        with tracer.start_as_current_span("POST /filter", kind=SpanKind.SERVER):
            pass
    assert kept(exporter) == expected


def test_background_never_outnumbers_what_the_standard_sampler_keeps() -> None:
    tracer, exporter = provider(sampler="parentbased_always_off", background_ratio=1.0)
    for _ in range(100):
        with tracer.start_as_current_span("sweep"):
            pass
    assert kept(exporter) == 0


def test_settings_read_the_standard_variables_case_blind() -> None:
    settings = TraceSettings.from_env(
        {"OTEL_TRACES_SAMPLER": " TraceIdRatio ", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    )
    assert settings == TraceSettings(sampler="traceidratio", ratio=0.5)
    assert "background" in trace_sampler(settings).get_description()
