"""Spans for every verb, with pod and outcome, and the allocator call in the same trace."""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from rgpu_extender import create_app
from rgpu_extender.instruments import label_attributes
from rgpu_runtime.telemetry import CREATION_LINK, TRACE_ANNOTATION, instrument_app, traceparent_of
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
    assert span.attributes["k8s.namespace.name"] == "ml-team"
    assert span.attributes["k8s.pod.name"] == "trainer-0"
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
    assert mutate.attributes["k8s.pod.name"] == "trainer-0"
    assert not [s for s in spans.get_finished_spans() if "k8s.pod" in (s.attributes or {})]


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


@pytest.fixture
async def traced(sim, allocator, discovery, build):  # type: ignore[no-untyped-def]
    """The extender as ``main()`` serves it: behind ``instrument_app``."""
    settings = build.settings(RGPU_KUBE_URL=sim.url)
    app = create_app(
        settings,
        allocator_transport=allocator.transport,
        discovery_transport=discovery.transport,
        registry=CollectorRegistry(),
    )
    async with LifespanManager(instrument_app(app)) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
            yield client


async def test_filter_and_bind_requests_name_the_pod_and_link_its_creation(
    spans, traced, build
) -> None:
    with trace.get_tracer("test").start_as_current_span("extender.mutate") as creation:
        recorded = traceparent_of(creation)
    assert recorded is not None
    pod = build.pod(annotations={TRACE_ANNOTATION: recorded})
    spans.clear()
    await eventually(
        lambda: _filtered(traced, build.filter_args(pod, ["gpu-node-1"])),
        what="a filter that is not an Error",
    )
    uid = pod["metadata"]["uid"]
    bind = {"PodName": "trainer-0", "PodNamespace": "ml-team", "PodUID": uid, "Node": "n"}
    await traced.post("/bind", json=bind)
    for request in ("POST /filter", "POST /bind"):
        span = named(spans, request)
        assert span.attributes["k8s.pod.uid"] == uid, request
        assert span.attributes["k8s.pod.name"] == "trainer-0", request
        (link,) = span.links
        assert link.context.span_id == creation.get_span_context().span_id, request
        assert dict(link.attributes) == CREATION_LINK
        verb = named(spans, f"extender.{request.split('/')[1]}")
        assert verb.parent.span_id == span.context.span_id


async def _filtered(client: httpx.AsyncClient, args: object) -> bool:
    return not (await client.post("/filter", json=args)).json()["Error"]


async def test_a_body_that_is_no_extender_args_names_no_pod_and_still_answers(
    spans, traced
) -> None:
    spans.clear()
    for body in ([1, 2], {"Pod": "x"}, {"pod": {"metadata": {"name": 7, "uid": ["u"]}}}):
        answer = await traced.post("/filter", json=body)
        assert answer.status_code == 200 and answer.json()["Error"]
    for span in spans.get_finished_spans():
        assert not any(key.startswith("k8s.pod") for key in span.attributes or {}), span.name


async def test_the_webhook_records_its_span_as_the_pods_creation(spans, traced, build) -> None:
    spans.clear()
    pod = build.pod(scheduler=None)
    review = (await traced.post("/mutate", json=build.review(pod))).json()
    patched = build.patched(review, pod)
    mutate = named(spans, "extender.mutate")
    recorded = patched["metadata"]["annotations"][TRACE_ANNOTATION]
    assert recorded.split("-")[1:3] == [
        f"{mutate.context.trace_id:032x}",
        f"{mutate.context.span_id:016x}",
    ]


def test_a_pod_without_a_name_yet_is_named_by_its_namespace_only() -> None:
    assert label_attributes("ml-team/trainer-*") == {"k8s.namespace.name": "ml-team"}
    assert label_attributes("ml-team/trainer-0") == {
        "k8s.namespace.name": "ml-team",
        "k8s.pod.name": "trainer-0",
    }
    assert label_attributes("") == {}
