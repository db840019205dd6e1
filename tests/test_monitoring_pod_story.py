"""One pod, one story: a GPU pod scheduled on kubesim reads as its traces joined by links.

The pod is created through the simulated apiserver, whose admission chain calls the
extender's webhook over TLS; kubesim's scheduler emulator then calls the extender's
``/filter``, ``/prioritize`` and ``/bind`` over HTTP, as kube-scheduler would. The services run
in process behind ``instrument_app`` (as ``main()`` serves them; the extender on its two real
listeners), with the real kubernetes_asyncio client. Spans are checked from an in-memory
exporter, and the same spans, sent over OTLP/HTTP to the CLI's embedded receiver, are drawn by
``rgpu trace``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from typer.testing import CliRunner

import rgpu_allocator
import rgpu_discovery
import rgpu_extender
from rgpu_allocator.settings import AllocatorSettings
from rgpu_cli.main import app as cli
from rgpu_discovery.settings import DiscoverySettings
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import ApiOptions, SimApiServer, run_apiserver
from rgpu_kubesim.fleet import FleetSpec, plan_fleet, seed_fleet
from rgpu_kubesim.scheduler import SchedulerConfig, SchedulerEmulator
from rgpu_runtime.serving import running
from rgpu_runtime.settings import Settings
from rgpu_runtime.telemetry import CREATION_LINK, TRACE_ANNOTATION, creation_of, instrument_app
from rgpu_sim.span_receiver import receiving
from rgpu_sim.stack import (
    SERVICES,
    SYSTEM_NAMESPACE,
    TRUSTED_USERS,
    _webhook_configuration,
    _write_certs,
    service_account,
)
from rgpu_sim.stack_rbac import apply_rbac, refused
from rgpu_testkit import container_manifest, eventually, pod_manifest


def _kind(service: str) -> type[Settings]:
    # Discovery, the allocator and the extender read settings of their own besides the shared.
    own: dict[str, type[Settings]] = {
        "allocator": AllocatorSettings,
        "discovery": DiscoverySettings,
        "extender": ExtenderSettings,
    }
    return own.get(service, Settings)


pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

NAMESPACE = "ml-team"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
POD = "trainer-0"
LEGACY = {"pod", "pod.uid", "node", "k8s.pod", "servers", "pods", "dry_run"}
"""Attribute names the services used before they followed the Kubernetes conventions."""


@dataclass
class Run:
    """The spans of one scheduled pod, in memory and in the embedded receiver's file."""

    spans: tuple[ReadableSpan, ...]
    pod: dict[str, Any]
    spans_file: Path
    scrape: str
    """The extender's ``/metrics`` as Prometheus asks for it (OpenMetrics), after the bind."""

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans if span.name == name]

    def one(self, name: str, **attributes: str) -> ReadableSpan:
        found = [
            s
            for s in self.named(name)
            if all((s.attributes or {}).get(k) == v for k, v in attributes.items())
        ]
        assert len(found) == 1, (name, attributes, [s.attributes for s in self.named(name)])
        return found[0]

    def parent_of(self, span: ReadableSpan) -> ReadableSpan:
        assert span.parent is not None, span.name
        (parent,) = [s for s in self.spans if s.context.span_id == span.parent.span_id]
        return parent

    def ancestors(self, span: ReadableSpan) -> list[str]:
        names = []
        while span.parent is not None:
            span = self.parent_of(span)
            names.append(span.name)
        return names


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One pod is scheduled for the whole module: its fixtures share one event loop."""
    return "asyncio"


@pytest.fixture(scope="module")
def exporter() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    """The process' provider (set once per process; another module may have set it)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield memory, provider
    memory.shutdown()


def settings(service: str, sim: SimApiServer, **extra: str) -> Settings:
    env = {
        "RGPU_KUBE_URL": sim.url,
        "RGPU_LOG_FORMAT": "text",
        "RGPU_AUTH": "none",
        "RGPU_TRUSTED_USERS": TRUSTED_USERS,
        "RGPU_PROBE_INTERVAL_SECONDS": "0.5",
        **extra,
    }
    return _kind(service).from_env(env, service=service)


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[SimApiServer]:
    agents = {f"rgpu-{s}": service_account(s) for s in SERVICES}
    async with run_apiserver(options=ApiOptions(seed=5, user_agents=agents)) as api:
        for namespace in (NAMESPACE, SYSTEM_NAMESPACE):
            api.store.create("namespaces", {"metadata": {"name": namespace}})
        # The services act as their accounts, with exactly the grants k8s/ gives them.
        apply_rbac(api.store)
        plan = plan_fleet(FleetSpec(servers=2, cards=2, clients=2, seed=5))
        async with seed_fleet(api.store, plan):
            yield api


@pytest.fixture(scope="module")
async def run(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
    sim: SimApiServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Run:
    memory, provider = exporter
    tmp_path = tmp_path_factory.mktemp("story")
    spans_file = tmp_path / "spans.jsonl"
    async with receiving(spans_file) as endpoint:
        shipping = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"))
        provider.add_span_processor(shipping)
        try:
            pod, scrape = await schedule_one_pod(sim, tmp_path)
            # The exporter posts from its own thread: flushing must not block the event loop
            # the receiver runs on.
            assert await anyio.to_thread.run_sync(shipping.force_flush)
        finally:
            await anyio.to_thread.run_sync(shipping.shutdown)
    return Run(spans=memory.get_finished_spans(), pod=pod, spans_file=spans_file, scrape=scrape)


async def schedule_one_pod(sim: SimApiServer, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """Create a GPU pod through the webhook and let the scheduler emulator bind it; the pod
    and the extender's OpenMetrics scrape."""
    certs = _write_certs(tmp_path)
    cert, key, ca_pem = certs.cert, certs.key, certs.ca.read_bytes()
    discovery = instrument_app(rgpu_discovery.create_app(settings("discovery", sim)))
    async with LifespanManager(discovery) as d:
        to_d = httpx.ASGITransport(app=d.app)
        allocator = rgpu_allocator.create_app(settings("allocator", sim), discovery_transport=to_d)
        async with LifespanManager(instrument_app(allocator)) as a:
            tls = {"RGPU_TLS_CERT_FILE": str(cert), "RGPU_TLS_KEY_FILE": str(key)}
            listen = {"RGPU_LISTEN": "127.0.0.1:0", "RGPU_WEBHOOK_LISTEN": "127.0.0.1:0", **tls}
            extender_settings = settings("extender", sim, **listen)
            extender = rgpu_extender.create_app(
                extender_settings,
                allocator_transport=httpx.ASGITransport(app=a.app),
                discovery_transport=to_d,
            )
            listeners = rgpu_extender.listeners(extender_settings)
            async with running(instrument_app(extender), *listeners) as (scheduler_url, hook):
                hooks = _webhook_configuration(f"{hook}/mutate", ca_pem)
                sim.store.create("mutatingwebhookconfigurations", hooks)
                pod = await create_and_bind(sim, scheduler_url)
                async with httpx.AsyncClient(base_url=scheduler_url) as client:
                    scraped = await client.get("/metrics", headers={"Accept": OPENMETRICS})
                return pod, scraped.text


async def create_and_bind(sim: SimApiServer, extender_url: str) -> dict[str, Any]:
    limits = {"nvidia.com/remote-gpu": "1", "nvidia.com/remote-gpu-memory": "8000"}
    manifest = pod_manifest(
        name=POD, namespace=NAMESPACE, containers=[container_manifest(limits=limits)]
    )
    async with (
        httpx.AsyncClient(base_url=sim.url, timeout=10) as api,
        anyio.create_task_group() as tg,
    ):
        config = SchedulerConfig(extender_url=extender_url, max_backoff_seconds=1.0, seed=5)
        scheduler = SchedulerEmulator(config, api)
        await tg.start(scheduler.run)
        created = await api.post(
            f"/api/v1/namespaces/{NAMESPACE}/pods", json=manifest, headers={"X-Sim-User": "alice"}
        )
        assert created.status_code == 201, created.text
        uid = created.json()["metadata"]["uid"]
        await eventually(
            lambda: (r := scheduler.records.get(uid)) is not None and r.bound_at is not None,
            timeout=30,
            what="the pod bound by the scheduler emulator",
        )
        tg.cancel_scope.cancel()
    bound: dict[str, Any] = sim.store.get("pods", POD, namespace=NAMESPACE)
    return bound


def link_targets(span: ReadableSpan) -> list[int]:
    assert all(dict(link.attributes or {}) == CREATION_LINK for link in span.links)
    return [link.context.span_id for link in span.links]


async def test_a_scheduled_pod_reads_as_one_connected_story(run: Run) -> None:
    uid = run.pod["metadata"]["uid"]
    named = {"k8s.namespace.name": NAMESPACE, "k8s.pod.name": POD, "rgpu.operation": "CREATE"}
    (creation,) = [
        s for s in run.named("extender.mutate") if s.attributes == {**s.attributes, **named}
    ]
    recorded = creation_of(run.pod)
    assert recorded is not None, run.pod["metadata"].get("annotations")
    assert recorded.span_id == creation.context.span_id
    assert run.pod["metadata"]["annotations"][TRACE_ANNOTATION].split("-")[1] == (
        f"{creation.context.trace_id:032x}"
    )

    # Admitted behind rgpu's gate: the booking is a trace of its own, linked to the creation.
    admitted = run.one("allocator.admit", **{"k8s.pod.uid": uid})
    assert admitted.parent is None
    assert link_targets(admitted) == [creation.context.span_id]
    (book,) = [s for s in run.named("book") if s.context.trace_id == admitted.context.trace_id]
    assert run.ancestors(book)[-1] == "allocator.admit"

    filtered = run.one("POST /filter", **{"k8s.pod.uid": uid})
    bound = run.one("POST /bind", **{"k8s.pod.uid": uid})
    for request in (filtered, bound):
        assert request.parent is None, "kube-scheduler sends no trace context"
        assert request.attributes["k8s.pod.name"] == POD
        assert link_targets(request) == [creation.context.span_id]
        assert request.context.trace_id != creation.context.trace_id
    commit = run.one("commit", **{"k8s.pod.uid": uid})
    assert commit.context.trace_id == bound.context.trace_id
    assert "extender.bind" in run.ancestors(commit)
    (binding,) = [
        s for s in run.named("POST pods/binding") if s.context.trace_id == bound.context.trace_id
    ]
    assert binding.attributes["k8s.object.name"] == POD

    steps = [creation, admitted, filtered, bound]
    assert [s.start_time for s in steps] == sorted(s.start_time for s in steps)


async def test_the_services_were_refused_nothing_under_k8s_rbac(
    run: Run, sim: SimApiServer
) -> None:
    assert [r.describe() for r in refused(sim)] == []


async def test_the_pods_event_is_written_in_the_verb_that_decided_it(run: Run) -> None:
    uid = run.pod["metadata"]["uid"]
    bound = run.one("POST /bind", **{"k8s.pod.uid": uid})
    writes = [s for s in run.named("POST events") if s.context.trace_id == bound.context.trace_id]
    assert writes, "the RemoteGPUAllocated Event's write is a root trace of its own"
    assert "extender.bind" in run.ancestors(writes[0])


async def test_every_span_names_pods_and_nodes_by_the_kubernetes_conventions(run: Run) -> None:
    legacy = {(s.name, key) for s in run.spans for key in s.attributes or {} if key in LEGACY}
    assert legacy == set()


async def test_rgpu_trace_draws_every_step_in_order_from_the_kept_spans(run: Run) -> None:
    result = CliRunner().invoke(
        cli, ["trace", f"{NAMESPACE}/{POD}"], env={"RGPU_TRACE_FILE": str(run.spans_file)}
    )

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert run.pod["metadata"]["uid"] in lines[0]
    steps = ["extender.mutate", "allocator.admit", "extender.filter", "extender.bind", "commit"]
    # The two header lines name the pod and the slowest step; the steps follow.
    body = lines[2:]
    found = [next(i for i, line in enumerate(body) if f" {step}" in line) for step in steps]
    assert found == sorted(found), (list(zip(steps, found, strict=True)), result.output)
    assert sum("◀" in line for line in lines) == 2  # the summary names it, and one step is marked


async def test_rgpu_trace_of_an_unknown_pod_says_so_in_one_line_and_fails(run: Run) -> None:
    result = CliRunner().invoke(
        cli, ["trace", f"{NAMESPACE}/nobody", "--file", str(run.spans_file)]
    )

    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert f"no span names pod {NAMESPACE}/nobody" in line


async def test_the_filter_histograms_exemplar_names_the_filter_trace(run: Run) -> None:
    uid = run.pod["metadata"]["uid"]
    filters = {
        f"{s.context.trace_id:032x}"
        for s in run.named("POST /filter")
        if s.attributes.get("k8s.pod.uid") == uid
    }
    named = {
        line.split('trace_id="')[1][:32]
        for line in run.scrape.splitlines()
        if line.startswith("rgpu_http_request_duration_seconds_bucket")
        and 'route="/filter"' in line
        and 'trace_id="' in line
    }
    assert named and named <= filters
