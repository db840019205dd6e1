"""Spans for every verb, with pod and outcome, and the allocator call in the same trace."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process; reuse one another test module set.
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


def named(exporter: InMemorySpanExporter, name: str):  # type: ignore[no-untyped-def]
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    assert found, f"no span {name}"
    return found[-1]


async def test_filter_span_carries_pod_and_outcome_and_the_allocator_joins_its_trace(
    spans, extender, allocator, build
) -> None:
    spans.clear()
    await extender.client.post("/filter", json=build.filter_args(build.pod(), ["gpu-node-1"]))
    span = named(spans, "extender.filter")
    assert span.attributes["k8s.pod"] == "ml-team/trainer-0"
    assert span.attributes["rgpu.outcome"] == "fit"
    traceparent = allocator.headers[-1]["traceparent"]
    assert traceparent.split("-")[1] == f"{span.context.trace_id:032x}"


async def test_prioritize_bind_and_mutate_have_spans(spans, extender, build) -> None:
    spans.clear()
    args = build.filter_args(build.pod(), ["gpu-node-1"])
    await extender.client.post("/prioritize", json=args)
    bind = {"PodName": "x", "PodNamespace": "ml-team", "PodUID": "u", "Node": "n"}
    await extender.client.post("/bind", json=bind)
    await extender.client.post("/mutate", json=build.review(build.pod(nodeName="n")))
    assert named(spans, "extender.prioritize").attributes["rgpu.outcome"] == "no_claim"
    assert named(spans, "extender.bind").attributes["rgpu.outcome"] == "claim_not_held"
    mutate = named(spans, "extender.mutate")
    assert mutate.attributes["rgpu.outcome"] == "denied"
    assert mutate.attributes["k8s.pod"] == "ml-team/trainer-0"


async def test_discovery_age_is_scraped_per_stream_once_discovery_answers(
    open_extender, discovery
) -> None:
    async with open_extender() as extender:
        await eventually(
            lambda: (
                extender.registry.get_sample_value(
                    "rgpu_extender_discovery_age_seconds", {"stream": "fleet"}
                )
                < 60
            ),
            what="the fleet's age once discovery answered",
        )
        first = extender.registry.get_sample_value(
            "rgpu_extender_discovery_age_seconds", {"stream": "topology"}
        )
        assert first is not None and first < 60


async def test_discovery_age_is_infinite_while_discovery_never_answered(
    open_extender, discovery
) -> None:
    discovery.available = False
    async with open_extender() as extender:
        age = extender.registry.get_sample_value(
            "rgpu_extender_discovery_age_seconds", {"stream": "fleet"}
        )
    assert age == math.inf
