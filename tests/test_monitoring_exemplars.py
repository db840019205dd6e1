"""From a latency panel to the trace: a real Prometheus stores the latency histograms'
exemplars, and each names a trace the trace pipeline received.

The extender and the allocator run in process behind ``instrument_app`` (as ``main()`` serves
them) on real loopback listeners, with the real kubernetes_asyncio client against kubesim.
Their spans leave through the real OTLP/HTTP exporter to the CLI's embedded receiver (the
OTLP capture of the run). Debian's Prometheus (2.42, ``--enable-feature=exemplar-storage``)
scrapes their ``/metrics`` every second, asking for OpenMetrics as it does; the test then asks
its ``/api/v1/query_exemplars`` for the ``/filter`` histogram's exemplars.
"""

from __future__ import annotations

import copy
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from anyio.abc import Process
from asgi_lifespan import LifespanManager
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import rgpu_allocator
import rgpu_discovery
import rgpu_extender
from rgpu_allocator.settings import AllocatorSettings
from rgpu_discovery.settings import DiscoverySettings
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_runtime.serving import Listener, running
from rgpu_runtime.settings import Settings
from rgpu_runtime.telemetry import EXEMPLAR_TRACE_ID, instrument_app
from rgpu_sim.processes import free_port
from rgpu_sim.span_receiver import receiving
from rgpu_sim.spans import read_spans
from rgpu_testkit import eventually, node_manifest, register_annotation, register_card


def _kind(service: str) -> type[Settings]:
    # Discovery, the allocator and the extender read settings of their own besides the shared.
    own: dict[str, type[Settings]] = {
        "allocator": AllocatorSettings,
        "discovery": DiscoverySettings,
        "extender": ExtenderSettings,
    }
    return own.get(service, Settings)


pytestmark = [pytest.mark.anyio, pytest.mark.process, pytest.mark.timeout(120)]

Load = Callable[[str], Any]
FILTERS = 6


def node(name: str, *, server: bool) -> dict[str, Any]:
    labels: dict[str, str] = {"kubernetes.io/hostname": name}
    annotations: dict[str, str] = {}
    if server:
        labels["hami.io/lupine-server"] = "14833"
        annotations["hami.io/node-nvidia-register"] = register_annotation([register_card()])
    return node_manifest(name=name, labels=labels, annotations=annotations, address="127.0.0.2")


@pytest.fixture
async def sim() -> AsyncIterator[SimApiServer]:
    async with run_apiserver() as api:
        for namespace in ("ml-team", "rgpu-system"):
            api.store.create("namespaces", {"metadata": {"name": namespace}})
        for name, server in (("gpu-node-1", False), ("gpu-node-2", True)):
            api.store.create("nodes", node(name, server=server))
        yield api


@pytest.fixture
async def capture(tmp_path: Path) -> AsyncIterator[tuple[Path, Callable[[], Any]]]:
    """The process' provider (set once per process) exporting to the embedded receiver."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    spans = tmp_path / "spans.jsonl"
    async with receiving(spans) as endpoint:
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"))
        provider.add_span_processor(processor)

        async def flush() -> None:
            # The exporter posts from its own thread, to a receiver on this event loop.
            assert await anyio.to_thread.run_sync(processor.force_flush)

        yield spans, flush
        await anyio.to_thread.run_sync(processor.shutdown)


def settings(service: str, sim: SimApiServer, **extra: str) -> Settings:
    env = {"RGPU_KUBE_URL": sim.url, "RGPU_LOG_FORMAT": "text", "RGPU_AUTH": "none", **extra}
    return _kind(service).from_env(env, service=service)


@pytest.fixture
async def served(sim: SimApiServer) -> AsyncIterator[dict[str, str]]:
    """The extender and the allocator on loopback listeners: their base URLs."""
    discovery = instrument_app(rgpu_discovery.create_app(settings("discovery", sim)))
    async with LifespanManager(discovery) as d:
        to_d = httpx.ASGITransport(app=d.app)
        allocator = rgpu_allocator.create_app(settings("allocator", sim), discovery_transport=to_d)
        listen = Listener(listen="127.0.0.1:0")
        async with running(instrument_app(allocator), listen) as (allocator_url,):
            extender = rgpu_extender.create_app(
                settings("extender", sim, RGPU_ALLOCATOR_URL=allocator_url),
                discovery_transport=to_d,
            )
            async with running(instrument_app(extender), listen) as (extender_url,):
                yield {"extender": extender_url, "allocator": allocator_url}


@pytest.fixture
async def prometheus(served: dict[str, str], tmp_path: Path) -> AsyncIterator[str]:
    """Debian's Prometheus with exemplar storage, scraping both services every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is missing: run `make setup` (installs Debian's prometheus)")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": f"rgpu-{service}",
                "honor_labels": True,
                "static_configs": [{"targets": [url.removeprefix("http://")]}],
            }
            for service, url in served.items()
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    args = [
        binary,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--enable-feature=exemplar-storage",
    ]
    with (tmp_path / "prometheus.log").open("wb") as log:
        process = await anyio.open_process(args, stdout=log, stderr=log)
        try:
            url = f"http://127.0.0.1:{port}"
            await eventually(lambda: ready(url, process), timeout=30, what="Prometheus ready")
            yield url
        finally:
            process.terminate()
            with anyio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


async def ready(url: str, process: Process) -> bool:
    assert process.returncode is None, "Prometheus exited; see prometheus.log"
    try:
        async with httpx.AsyncClient(timeout=1) as client:
            return (await client.get(f"{url}/-/ready")).status_code == 200
    except httpx.HTTPError:
        return False


async def schedule(load: Load, extender: str) -> list[str]:
    """Filter ``FILTERS`` pods; their uids."""
    args = load("k8s/extender-filter-args.json")
    uids = []
    async with httpx.AsyncClient(base_url=extender, timeout=10) as client:
        for index in range(FILTERS):
            pod = copy.deepcopy(args["Pod"])
            pod["metadata"]["name"] = f"trainer-{index}"
            pod["metadata"]["uid"] = f"0000000{index}-5b2d-4c7a-9e1f-0a2b3c4d5e6f"
            uids.append(pod["metadata"]["uid"])

            async def filtered(pod: dict[str, Any] = pod) -> bool:
                answer = await client.post("/filter", json={**args, "Pod": pod})
                return not answer.json()["Error"]

            await eventually(filtered, timeout=15, what="a filter that is not an Error")
    return uids


async def exemplars(prometheus: str, query: str) -> list[dict[str, str]]:
    now = time.time()
    params = {"query": query, "start": str(now - 600), "end": str(now + 60)}
    async with httpx.AsyncClient(base_url=prometheus, timeout=5) as client:
        answer = await client.get("/api/v1/query_exemplars", params=params)
    assert answer.status_code == 200, answer.text
    return [
        exemplar["labels"] for series in answer.json()["data"] for exemplar in series["exemplars"]
    ]


async def test_filter_exemplars_in_prometheus_name_traces_of_the_otlp_capture(
    capture: tuple[Path, Callable[[], Any]],
    served: dict[str, str],
    prometheus: str,
    load_fixture: Load,
) -> None:
    spans_file, flush = capture
    await schedule(load_fixture, served["extender"])
    query = 'rgpu_http_request_duration_seconds_bucket{service="extender", route="/filter"}'

    async def stored() -> list[dict[str, str]]:
        return await exemplars(prometheus, query)

    await eventually(stored, timeout=30, interval=0.5, what="the /filter exemplars in Prometheus")
    await flush()

    found = await stored()
    captured = {(s.trace_id, s.span_id): s for s in read_spans(spans_file)}
    traces = {trace_id for trace_id, _ in captured}
    assert found and {labels[EXEMPLAR_TRACE_ID] for labels in found} <= traces
    for labels in found:
        span = captured[(labels[EXEMPLAR_TRACE_ID], labels["span_id"])]
        assert (span.name, span.kind, span.service) == ("POST /filter", "server", span.service)
        assert span.attribute("k8s.pod.name").startswith("trainer-")
    for other in (
        'rgpu_extender_verb_duration_seconds_bucket{verb="filter"}',
        'rgpu_http_request_duration_seconds_bucket{service="allocator"}',
    ):
        await eventually(lambda q=other: exemplars(prometheus, q), timeout=30, interval=0.5)
        names = {labels[EXEMPLAR_TRACE_ID] for labels in await exemplars(prometheus, other)}
        assert names <= traces, other
