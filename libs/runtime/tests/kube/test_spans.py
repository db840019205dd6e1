from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration
from libs.runtime.tests.conftest import Apiserver
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rgpu_runtime.errors import KubeNotFound
from rgpu_runtime.kube import KubeClient
from rgpu_runtime.kube._spans import KubeRequest, trace_requests
from rgpu_runtime.serving import Listener, running

pytestmark = pytest.mark.anyio

UID = "8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def traced(apiserver: Apiserver, exporter: InMemorySpanExporter) -> AsyncIterator[KubeClient]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    configuration = Configuration()
    configuration.host = apiserver.url
    api_client = ApiClient(configuration)
    trace_requests(api_client, provider)
    try:
        yield KubeClient(api_client, timeout=2.0)
    finally:
        await api_client.close()


def only(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


@pytest.mark.parametrize(
    ("method", "url", "query", "name", "verb"),
    [
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/rgpu-system/leases/rgpu-a",
            (),
            "PUT leases",
            "update",
        ),
        (
            "PATCH",
            "/apis/coordination.k8s.io/v1/namespaces/rgpu-system/leases/rgpu-a",
            (),
            "PATCH leases",
            "patch",
        ),
        (
            "POST",
            "/api/v1/namespaces/ml-team/pods/trainer-0/binding",
            (),
            "POST pods/binding",
            "create",
        ),
        ("GET", "/api/v1/pods", (("watch", True),), "GET pods", "watch"),
        ("GET", "/api/v1/pods", (("limit", 500),), "GET pods", "list"),
        ("GET", "/api/v1/nodes/gpu-a", (), "GET nodes", "get"),
        ("DELETE", "/api/v1/namespaces/ml-team/pods", (), "DELETE pods", "deletecollection"),
        ("POST", "/api/v1/namespaces", (), "POST namespaces", "create"),
    ],
)
def test_requests_are_named_by_method_and_resource_never_by_object(
    method: str, url: str, query: tuple[tuple[str, object], ...], name: str, verb: str
) -> None:
    request = KubeRequest.parse(method, f"https://10.0.0.1:6443{url}", query)
    assert request.span_name == name
    assert request.verb == verb
    assert "trainer-0" not in request.span_name and "rgpu-a" not in request.span_name


async def test_binding_is_a_client_span_with_http_and_k8s_attributes(
    traced: KubeClient, exporter: InMemorySpanExporter
) -> None:
    await traced.bind_pod("ml-team", "trainer-0", uid=UID, node="gpu-node-1", annotations={})

    span = only(exporter)
    assert span.name == "POST pods/binding"
    assert span.kind is SpanKind.CLIENT
    attributes = dict(span.attributes or {})
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.response.status_code"] == 201
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["k8s.verb"] == "create"
    assert attributes["k8s.resource"] == "pods"
    assert attributes["k8s.subresource"] == "binding"
    assert attributes["k8s.namespace.name"] == "ml-team"
    assert attributes["k8s.object.name"] == "trainer-0"
    assert attributes["k8s.pod.name"] == "trainer-0"


async def test_an_error_answer_marks_the_span_failed_with_its_status(
    traced: KubeClient, exporter: InMemorySpanExporter
) -> None:
    with pytest.raises(KubeNotFound):
        await traced.call(traced.core.read_namespaced_pod, "nobody", "ml-team")

    span = only(exporter)
    assert span.name == "GET pods"
    assert (span.attributes or {})["http.response.status_code"] == 404
    assert span.status.status_code is StatusCode.ERROR


async def test_raw_fast_path_calls_are_traced_too(
    traced: KubeClient, exporter: InMemorySpanExporter
) -> None:
    await traced.call_raw(traced.core.read_namespaced_pod, "trainer-0", "ml-team")

    span = only(exporter)
    assert span.name == "GET pods"
    assert (span.attributes or {})["k8s.verb"] == "get"
    assert (span.attributes or {})["http.response.status_code"] == 200


async def test_the_request_carries_the_client_spans_traceparent(
    exporter: InMemorySpanExporter,
) -> None:
    async def echo(request: Request) -> JSONResponse:
        headers = {"traceparent": request.headers.get("traceparent", "")}
        return JSONResponse({"metadata": {"annotations": headers}})

    app = Starlette(routes=[Route("/api/v1/namespaces/{ns}/pods/{name}", echo)])
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with running(app, Listener(listen="127.0.0.1:0")) as urls:
        configuration = Configuration()
        configuration.host = urls[0]
        async with ApiClient(configuration) as api_client:
            trace_requests(api_client, provider)
            kube = KubeClient(api_client, timeout=2.0)
            pod = await kube.call_raw(kube.core.read_namespaced_pod, "trainer-0", "ml-team")

    span = only(exporter)
    sent = {"traceparent": pod["metadata"]["annotations"]["traceparent"]}
    context = trace.get_current_span(propagate.extract(sent)).get_span_context()
    assert context.span_id == span.context.span_id
    assert context.trace_id == span.context.trace_id
