"""Spans: Node list/watch cycles and lupine probes are traced."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from rgpu_kubesim.lupine import run_lupine

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """An in-memory exporter on the global provider (installed once per process)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


async def test_list_watch_and_probe_spans_are_recorded(
    sim, start, build, exporter: InMemorySpanExporter
) -> None:
    async with run_lupine(gpus=["GPU-0"]) as lupine:
        annotation = build.register(build.card("GPU-0"))
        node = build.node("gpu-a", server=str(lupine.port), ip="127.0.0.1", annotation=annotation)
        sim.store.create("nodes", node)
        async with start() as discovery:
            await discovery.server_when("gpu-a", lambda s: s.usage_reported)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert spans["discovery.nodes.list"].attributes["rgpu.nodes"] == 1
    # The stop closed the watch: a normal end, not an error with a GeneratorExit recorded.
    watch = spans["discovery.nodes.watch"]
    assert watch.status.status_code == StatusCode.UNSET
    assert not watch.events
    probe = spans["discovery.lupine.probe"]
    assert probe.attributes["rgpu.server"] == "gpu-a"
    assert probe.attributes["rgpu.endpoint"] == lupine.endpoint
    assert probe.attributes["rgpu.probe.result"] == "usage"
