"""Traces as a collector receives them: span names bounded, apiserver writes under the verb.

Discovery, allocator and extender run in process behind ``instrument_app`` (as ``main()``
serves them), wired through ASGITransport, with the real kubernetes_asyncio client against
kubesim over HTTP. Their spans leave through the real OTLP/HTTP exporter to a receiver on
loopback, which decodes the protobuf ``ExportTraceServiceRequest``s.
"""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from asgi_lifespan import LifespanManager
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import rgpu_allocator
import rgpu_discovery
import rgpu_extender
from rgpu_allocator.settings import AllocatorSettings
from rgpu_discovery.settings import DiscoverySettings
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_runtime.settings import Settings
from rgpu_runtime.telemetry import instrument_app
from rgpu_testkit import eventually, node_manifest, register_annotation, register_card


def _kind(service: str) -> type[Settings]:
    # Discovery, the allocator and the extender read settings of their own besides the shared.
    own: dict[str, type[Settings]] = {
        "allocator": AllocatorSettings,
        "discovery": DiscoverySettings,
        "extender": ExtenderSettings,
    }
    return own.get(service, Settings)


pytestmark = pytest.mark.anyio

Load = Callable[[str], Any]

AUTH = {
    "RGPU_AUTH": "tokenreview",
    "RGPU_ALLOCATION_CALLERS": "system:serviceaccount:rgpu-system:rgpu-extender",
}
"""Authenticated as k8s/ deploys it; each service mints its token (RGPU_TOKEN_ACCOUNT)."""


class Receiver:
    """An OTLP/HTTP trace receiver: every span it was sent, by span id."""

    def __init__(self) -> None:
        self.spans: dict[bytes, Span] = {}

    async def traces(self, request: Request) -> Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.body())
        for resource_spans in message.resource_spans:
            for scope in resource_spans.scope_spans:
                self.spans.update((span.span_id, span) for span in scope.spans)
        return Response(status_code=200)

    def named(self, name: str) -> list[Span]:
        return [span for span in self.spans.values() if span.name == name]

    def ancestors(self, span: Span) -> list[str]:
        names = []
        while span.parent_span_id in self.spans:
            span = self.spans[span.parent_span_id]
            names.append(span.name)
        return names


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    sink = Receiver()
    app = Starlette(routes=[Route("/v1/traces", sink.traces, methods=["POST"])])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        await eventually(lambda: server.started, timeout=10)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield sink, f"http://127.0.0.1:{port}/v1/traces"
        server.should_exit = True


@pytest.fixture
async def exporting(receiver: tuple[Receiver, str]) -> AsyncIterator[tuple[Receiver, Any]]:
    """The process' provider (set once per process; other modules may have set it) sending
    to the receiver. The exporter posts from its own thread, so flushing must not block the
    event loop the receiver runs on."""
    sink, url = receiver
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=url))
    provider.add_span_processor(processor)

    async def flush() -> None:
        assert await anyio.to_thread.run_sync(processor.force_flush)

    yield sink, flush
    await anyio.to_thread.run_sync(processor.shutdown)


@dataclass
class Wired:
    sim: SimApiServer
    extender: httpx.AsyncClient


def node(name: str, *, server: bool) -> dict[str, Any]:
    labels: dict[str, str] = {"kubernetes.io/hostname": name}
    annotations: dict[str, str] = {}
    if server:
        labels["hami.io/lupine-server"] = "14833"
        annotations["hami.io/node-nvidia-register"] = register_annotation([register_card()])
    return node_manifest(name=name, labels=labels, annotations=annotations, address="127.0.0.2")


@pytest.fixture
async def wired() -> AsyncIterator[Wired]:
    async with run_apiserver() as sim:
        for namespace in ("ml-team", "rgpu-system"):
            sim.store.create("namespaces", {"metadata": {"name": namespace}})
        for name, server in (("gpu-node-1", False), ("gpu-node-2", True), ("cpu-node-1", False)):
            sim.store.create("nodes", node(name, server=server))
        for account in ("rgpu-allocator", "rgpu-extender"):
            meta = {"name": account, "namespace": "rgpu-system"}
            sim.store.create("serviceaccounts", {"metadata": meta})
        env = {"RGPU_KUBE_URL": sim.url, "RGPU_LOG_FORMAT": "text", **AUTH}

        def settings(service: str) -> Settings:
            account = {"RGPU_TOKEN_ACCOUNT": f"rgpu-{service}"}
            return _kind(service).from_env({**env, **account}, service=service)

        discovery = instrument_app(rgpu_discovery.create_app(settings("discovery")))
        async with LifespanManager(discovery) as d:
            to_d = httpx.ASGITransport(app=d.app)
            allocator = rgpu_allocator.create_app(settings("allocator"), discovery_transport=to_d)
            async with LifespanManager(instrument_app(allocator)) as a:
                extender = rgpu_extender.create_app(
                    settings("extender"),
                    allocator_transport=httpx.ASGITransport(app=a.app),
                    discovery_transport=to_d,
                )
                async with (
                    LifespanManager(instrument_app(extender)) as e,
                    httpx.AsyncClient(
                        transport=httpx.ASGITransport(app=e.app), base_url="http://ext"
                    ) as client,
                ):
                    yield Wired(sim=sim, extender=client)


def fixture_pod(wired: Wired, args: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(args["Pod"])
    pod["metadata"] = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")}
    pod["metadata"]["name"] = "trainer-0"
    pod.pop("status")
    created: dict[str, Any] = wired.sim.store.create("pods", pod, namespace="ml-team")
    return created


async def filter_and_bind(wired: Wired, load: Load) -> dict[str, Any]:
    args = load("k8s/extender-filter-args.json")
    pod = fixture_pod(wired, args)

    async def filtered() -> bool:
        answer = await wired.extender.post("/filter", json={**args, "Pod": pod})
        return not answer.json()["Error"]

    await eventually(filtered, timeout=10, what="the extender's filter passing the pod")
    bind = {**load("k8s/extender-bind-args.json"), "PodUID": pod["metadata"]["uid"]}
    assert (await wired.extender.post("/bind", json=bind)).json() == {"Error": ""}
    return pod


async def test_the_lease_write_shows_under_the_filter_and_the_binding_under_the_bind(
    exporting: tuple[Receiver, Any], wired: Wired, load_fixture: Load
) -> None:
    sink, flush = exporting
    await filter_and_bind(wired, load_fixture)
    await flush()

    lease_writes = [
        s for s in sink.spans.values() if re.fullmatch(r"(POST|PUT|PATCH) leases", s.name)
    ]
    under_filter = [s for s in lease_writes if "POST /filter" in sink.ancestors(s)]
    assert under_filter, sorted({s.name for s in sink.spans.values()})
    assert "POST /v1/allocations" in sink.ancestors(under_filter[0])
    assert under_filter[0].kind == Span.SpanKind.SPAN_KIND_CLIENT
    (binding,) = sink.named("POST pods/binding")
    assert "POST /bind" in sink.ancestors(binding)
    attributes = {a.key: a.value.string_value for a in binding.attributes}
    assert attributes["k8s.object.name"] == "trainer-0"
    assert attributes["k8s.namespace.name"] == "ml-team"


async def test_no_span_name_carries_an_object_name_or_uid(
    exporting: tuple[Receiver, Any], wired: Wired, load_fixture: Load
) -> None:
    sink, flush = exporting
    pod = await filter_and_bind(wired, load_fixture)
    await flush()

    names = {span.name for span in sink.spans.values()}
    assert "POST /v1/allocations/{uid}/commit" in names
    for forbidden in (pod["metadata"]["uid"], "trainer-0", "gpu-node-1", "gpu-node-2"):
        assert not [name for name in names if forbidden in name], forbidden
