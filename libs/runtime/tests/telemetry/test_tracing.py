from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_runtime.serving import create_service_app, json_response
from rgpu_runtime.telemetry import instrument_app
from rgpu_runtime.telemetry._tracing import exporting_provider, tracer

pytestmark = pytest.mark.anyio

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def client(exporter: InMemorySpanExporter) -> AsyncIterator[httpx.AsyncClient]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def work(request: Request) -> Response:
        return json_response({"ok": True})

    routes = [Route("/work", work), Route("/v1/allocations/{uid}/commit", work, methods=["POST"])]
    app = create_service_app(service="test", routes=routes)
    transport = httpx.ASGITransport(app=instrument_app(app, provider))
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
        yield client


async def test_requests_continue_the_callers_trace(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    await client.get("/work", headers={"traceparent": traceparent})
    spans = exporter.get_finished_spans()
    server = [s for s in spans if s.parent is not None and s.parent.span_id == int(PARENT_ID, 16)]
    assert server
    assert all(f"{s.context.trace_id:032x}" == TRACE_ID for s in spans)


async def test_probe_and_scrape_paths_are_not_traced(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        await client.get(path)
    assert exporter.get_finished_spans() == ()


def test_no_endpoint_means_no_exporting_provider() -> None:
    assert exporting_provider("rgpu-test", {}) is None


def test_sdk_disabled_means_no_exporting_provider() -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}
    assert exporting_provider("rgpu-test", environ) is None


@pytest.mark.parametrize(
    ("environ", "endpoint"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
            "http://collector:4318/v1/traces",
        ),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/t"}, "http://c:4318/t"),
    ],
)
def test_endpoint_builds_a_named_provider_exporting_over_otlp_http(
    environ: dict[str, str], endpoint: str
) -> None:
    provider = exporting_provider("rgpu-allocator", environ)
    assert provider is not None
    try:
        assert provider.resource.attributes["service.name"] == "rgpu-allocator"
        processor = provider._active_span_processor._span_processors[0]
        exporter = processor.span_exporter  # type: ignore[attr-defined]
        assert isinstance(exporter, OTLPSpanExporter)
        assert exporter._endpoint == endpoint
    finally:
        provider.shutdown()


def test_tracer_spans_continue_the_current_trace_even_without_an_exporter() -> None:
    caller = TracerProvider().get_tracer("caller")
    with (
        caller.start_as_current_span("outer") as outer,
        tracer("rgpu.test").start_as_current_span("inner") as inner,
    ):
        assert inner.get_span_context().trace_id == outer.get_span_context().trace_id


async def test_server_spans_are_named_by_route_template_not_by_raw_path(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    await client.post("/v1/allocations/8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f/commit")

    (span,) = exporter.get_finished_spans()
    assert span.name == "POST /v1/allocations/{uid}/commit"
    assert (span.attributes or {})["http.route"] == "/v1/allocations/{uid}/commit"


async def test_a_request_no_route_matched_is_named_by_its_method_alone(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    await client.get("/v1/claims/8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f")

    (span,) = exporter.get_finished_spans()
    assert span.name == "GET"
    assert "http.route" not in (span.attributes or {})


OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def exemplars(exposition: str, route: str) -> set[str]:
    """Trace ids of the request histogram's exemplars for ``route``."""
    return {
        line.split('trace_id="')[1][:32]
        for line in exposition.splitlines()
        if line.startswith("rgpu_http_request_duration_seconds_bucket")
        and f'route="{route}"' in line
        and " # {" in line
    }


async def test_the_latency_histogram_names_the_requests_trace_in_openmetrics(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    await client.get("/work")
    (span,) = exporter.get_finished_spans()

    scraped = await client.get("/metrics", headers={"Accept": OPENMETRICS})

    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert exemplars(scraped.text, "/work") == {f"{span.context.trace_id:032x}"}
    assert f'span_id="{span.context.span_id:016x}"' in scraped.text


async def test_the_plain_text_format_carries_no_exemplars(client: httpx.AsyncClient) -> None:
    await client.get("/work")

    scraped = await client.get("/metrics")

    assert scraped.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in scraped.text
    assert 'route="/work"' in scraped.text


async def test_an_unsampled_request_leaves_no_exemplar() -> None:
    provider = TracerProvider(sampler=ALWAYS_OFF)

    async def work(request: Request) -> Response:
        return json_response({"ok": True})

    app = create_service_app(service="test", routes=[Route("/work", work)])
    transport = httpx.ASGITransport(app=instrument_app(app, provider))
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as unsampled:
        await unsampled.get("/work")
        scraped = await unsampled.get("/metrics", headers={"Accept": OPENMETRICS})
    assert 'route="/work"' in scraped.text
    assert "trace_id" not in scraped.text
