"""The Grafana dashboard works behind the Prometheus Operator, not only on a direct scrape.

The four services run in process (discovery, allocator, extender and metrics wired through
ASGITransport, the real kubernetes_asyncio client against kubesim over HTTP) and serve real
traffic: a pod filtered and bound, a second one refused, a webhook admission, an apiserver
failure. Each service's ``/metrics`` is then relabeled as the Operator's ServiceMonitor would
(the target labels it adds, with the ``honorLabels`` the manifest sets) and every dashboard
expression is evaluated by ``promtool test rules`` over those series: each must return data.

The span-metric panels read what the collector's spanmetrics connector exports: those series
are built from the spans the same traffic produced (the apps run behind ``instrument_app``, as
``main()`` serves them), named and bucketed as ``collector-config.yaml`` configures the
connector, and relabeled as the Operator does for the collector's ServiceMonitor.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from asgi_lifespan import LifespanManager
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

import rgpu_allocator
import rgpu_discovery
import rgpu_extender
import rgpu_metrics
from rgpu_allocator.settings import AllocatorSettings
from rgpu_discovery.settings import DiscoverySettings
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_runtime.settings import Settings
from rgpu_runtime.telemetry import EXEMPLAR_TRACE_ID, instrument_app
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


async def extender_token(sim_url: str) -> str:
    """The extender's rgpu token, minted by TokenRequest (what its kubelet would project)."""
    path = "/api/v1/namespaces/rgpu-system/serviceaccounts/rgpu-extender/token"
    async with httpx.AsyncClient(base_url=sim_url, timeout=10) as api:
        answer = await api.post(path, json={"spec": {"audiences": ["rgpu-allocator"]}})
    token: str = answer.json()["status"]["token"]
    return token


Labels = dict[str, str]
Sample = tuple[str, Labels, float]

OBSERVABILITY = Path(__file__).resolve().parents[1] / "k8s" / "components" / "observability"
SERVICES = ("discovery", "allocator", "extender", "metrics")
TARGET_LABELS = ("job", "namespace", "service", "pod", "container", "endpoint", "instance")
"""Labels the Prometheus Operator puts on every target of a ServiceMonitor endpoint."""
GROWING = ("_total", "_bucket", "_count", "_sum")
"""Counter-like samples: fed to promtool as growing from zero so ``rate()`` sees traffic."""


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run `make setup` (installs Debian's prometheus package)")
    return path


def server_node(name: str) -> dict[str, Any]:
    cards = (register_card(uuid=f"GPU-{name}-{i}", index=i, model="NVIDIA-A100") for i in range(2))
    return node(name, {"hami.io/lupine-server": "14833"}, register_annotation(cards))


def node(name: str, labels: Mapping[str, str], register: str | None = None) -> dict[str, Any]:
    annotations = {} if register is None else {"hami.io/node-nvidia-register": register}
    return node_manifest(name=name, labels=labels, annotations=annotations, address="127.0.0.2")


class Stack:
    """The four apps in one process, and a client for each."""

    def __init__(
        self,
        sim: SimApiServer,
        clients: Mapping[str, httpx.AsyncClient],
        spans: InMemorySpanExporter,
    ) -> None:
        self.sim = sim
        self.clients = clients
        self.spans = spans

    async def scrape(self, service: str) -> str:
        response = await self.clients[service].get("/metrics")
        assert response.status_code == 200, response.text
        return response.text


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans of the process' provider (set once per process; another module may have)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


@pytest.fixture
async def stack(spans: InMemorySpanExporter) -> AsyncIterator[Stack]:
    async with run_apiserver() as sim:
        for namespace in ("ml-team", "rgpu-system"):
            sim.store.create("namespaces", {"metadata": {"name": namespace}})
        sim.store.create("nodes", server_node("gpu-node-2"))
        for name in ("gpu-node-1", "cpu-node-1"):
            sim.store.create("nodes", node(name, {"kubernetes.io/hostname": name}))
        for account in ("rgpu-allocator", "rgpu-extender"):
            meta = {"name": account, "namespace": "rgpu-system"}
            sim.store.create("serviceaccounts", {"metadata": meta})
        env = {"RGPU_KUBE_URL": sim.url, "RGPU_LOG_FORMAT": "text", **AUTH}

        def settings(service: str) -> Settings:
            account = {"RGPU_TOKEN_ACCOUNT": f"rgpu-{service}"}
            return _kind(service).from_env({**env, **account}, service=service)

        discovery = rgpu_discovery.create_app(settings("discovery"))
        async with LifespanManager(instrument_app(discovery)) as d:
            to_d = httpx.ASGITransport(app=d.app)
            allocator = rgpu_allocator.create_app(settings("allocator"), discovery_transport=to_d)
            async with LifespanManager(instrument_app(allocator)) as a:
                to_a = httpx.ASGITransport(app=a.app)
                extender = rgpu_extender.create_app(
                    settings("extender"), allocator_transport=to_a, discovery_transport=to_d
                )
                metrics = rgpu_metrics.create_app(
                    settings("metrics"), discovery_transport=to_d, allocator_transport=to_a
                )
                async with (
                    LifespanManager(instrument_app(extender)) as e,
                    LifespanManager(instrument_app(metrics)) as m,
                ):
                    apps = {"discovery": d.app, "allocator": a.app, "extender": e.app}
                    apps["metrics"] = m.app
                    clients = {
                        name: httpx.AsyncClient(
                            transport=httpx.ASGITransport(app=app), base_url=f"http://{name}"
                        )
                        for name, app in apps.items()
                    }
                    yield Stack(sim, clients, spans)
                    for client in clients.values():
                        await client.aclose()


def fixture_pod(stack: Stack, args: Mapping[str, Any], name: str) -> dict[str, Any]:
    pod = copy.deepcopy(args["Pod"])
    pod["metadata"] = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")}
    pod["metadata"]["name"] = name
    pod.pop("status")
    created: dict[str, Any] = stack.sim.store.create("pods", pod, namespace="ml-team")
    return created


async def filter_pod(stack: Stack, args: Mapping[str, Any], pod: Mapping[str, Any]) -> Any:
    """Filter like kube-scheduler: an ``Error`` while the inventory syncs means retry."""
    with anyio.fail_after(10):
        while True:
            response = await stack.clients["extender"].post("/filter", json={**args, "Pod": pod})
            reply = response.json()
            if not reply["Error"]:
                return reply
            await anyio.sleep(0.05)


async def drive_traffic(stack: Stack, load: Load) -> None:
    """Everything the dashboard shows: a holder, a refusal, the webhook, a 5xx, a quota."""
    queues = {"queues.yaml": "default: {cards: 64}"}
    body = {"metadata": {"name": "rgpu-queues"}, "data": queues}
    stack.sim.store.create("configmaps", body, namespace="rgpu-system")
    args = load("k8s/extender-filter-args.json")
    first, second = fixture_pod(stack, args, "trainer-0"), fixture_pod(stack, args, "trainer-1")
    assert (await filter_pod(stack, args, first))["NodeNames"]
    prioritize = {**load("k8s/extender-prioritize-args.json"), "Pod": first}
    assert (await stack.clients["extender"].post("/prioritize", json=prioritize)).is_success
    bind = {**load("k8s/extender-bind-args.json"), "PodUID": first["metadata"]["uid"]}
    assert (await stack.clients["extender"].post("/bind", json=bind)).json() == {"Error": ""}
    assert (await filter_pod(stack, args, second))["FailedNodes"]
    review = load("k8s/admission-review-pod-create.json")
    assert (await stack.clients["extender"].post("/mutate", json=review)).is_success
    stack.sim.faults.set_error(verb="*", resource="leases", rate=1.0, code=500)
    # A release reads its pod first (a bound pod's claim is never released): fail that too.
    stack.sim.faults.set_error(verb="get", resource="pods", rate=1.0, code=500)
    uid = first["metadata"]["uid"]
    extender = {"Authorization": f"Bearer {await extender_token(stack.sim.url)}"}
    failed = await stack.clients["allocator"].delete(f"/v1/allocations/{uid}", headers=extender)
    assert failed.status_code >= 500, failed.text
    stack.sim.faults.clear()
    await wait_for_holder(stack)


async def wait_for_holder(stack: Stack) -> None:
    async def holder_shown() -> bool:
        return "rgpu_card_holder_info{" in await stack.scrape("metrics")

    await eventually(holder_shown, timeout=10, what="a card holder in metrics' /metrics")


def honor_labels() -> bool:
    """Whether the services' ServiceMonitor (``rgpu``) honours their labels."""
    monitors = yaml.safe_load_all((OBSERVABILITY / "servicemonitor.yaml").read_text())
    (monitor,) = [m for m in monitors if m["metadata"]["name"] == "rgpu"]
    (endpoint,) = monitor["spec"]["endpoints"]
    return bool(endpoint.get("honorLabels", False))


def target_labels(service: str) -> Labels:
    """What the Operator's relabeling gives a target of ``service`` (one pod, port ``http``)."""
    name = f"rgpu-{service}"
    return {
        "job": name,
        "namespace": "rgpu-system",
        "service": name,
        "pod": f"{name}-6b8d9c7f5-x2v4q",
        "container": service,
        "endpoint": "http",
        "instance": "10.244.1.17:8080",
    }


def relabel(labels: Mapping[str, str], target: Mapping[str, str], *, honor: bool) -> Labels:
    """Prometheus' merge of scraped and target labels (``honor_labels`` semantics)."""
    merged = dict(labels)
    for key, value in target.items():
        if key in merged and honor:
            continue
        if key in merged:
            merged[f"exported_{key}"] = merged[key]
        merged[key] = value
    return merged


def samples(exposition: str) -> Iterator[Sample]:
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                yield sample.name, dict(sample.labels), float(sample.value)


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def declared(exposition: str) -> Iterator[str]:
    """Series names a family will carry, even a labelled one that has no child yet."""
    for family in text_string_to_metric_families(exposition):
        for suffix in SUFFIXES.get(family.type, ("",)):
            yield family.name + suffix


def dashboard_expressions() -> dict[str, str]:
    dashboard = json.loads((OBSERVABILITY / "dashboard.json").read_text())
    found = {
        f"{panel['title']} [{target['refId']}]": target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    }
    for variable in dashboard["templating"]["list"]:
        query = variable.get("definition", "")
        if match := re.fullmatch(r"label_values\((\w+(?:\{[^}]*\})?), (\w+)\)", query):
            found[f"variable {variable['name']}"] = f"group by ({match[2]}) ({match[1]})"
    return {
        title: expr.replace("$__rate_interval", "2m")
        .replace("$__range", "2m")
        .replace('=~"$server"', '=~".*"')
        .replace('=~"$span"', '=~".*"')
        for title, expr in found.items()
    }


def series_line(name: str, labels: Mapping[str, str], value: float) -> dict[str, str]:
    rendered = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    start = 0.0 if name.endswith(GROWING) else value
    return {"series": f"{name}{{{rendered}}}", "values": f"{start!r} {value!r}"}


def promtool_suite(series: list[dict[str, str]], expressions: Mapping[str, str]) -> str:
    """One rule unit test: ``absent(expr)`` returns nothing exactly when ``expr`` has data."""
    checks = [
        {"expr": f"absent({expr})", "eval_time": "1m", "exp_samples": []}
        for expr in expressions.values()
    ]
    test = {"interval": "1m", "input_series": series, "promql_expr_test": checks}
    return yaml.safe_dump({"rule_files": [], "tests": [test]}, width=10_000)


async def test_every_dashboard_expression_returns_data_behind_the_operator(
    stack: Stack, load_fixture: Load, tmp_path: Path
) -> None:
    binary = promtool()
    await drive_traffic(stack, load_fixture)
    series = await scraped_behind_the_operator(stack)
    suite = tmp_path / "dashboard_test.yaml"
    suite.write_text(promtool_suite(series, dashboard_expressions()))

    result = await anyio.run_process([binary, "test", "rules", str(suite)], check=False)

    assert result.returncode == 0, (result.stdout + result.stderr).decode()


async def test_the_alerts_target_selectors_match_the_series_behind_the_operator(
    stack: Stack, load_fixture: Load, tmp_path: Path
) -> None:
    """Each alert's matchers on target labels (``service``, ``job``, ``pod``...) select the
    relabeled series (and Prometheus' own ``up``) they are written for."""
    binary = promtool()
    await drive_traffic(stack, load_fixture)
    series = await scraped_behind_the_operator(stack)
    present = {line["series"].split("{")[0] for line in series}
    checks = {
        selector: selector
        for selector in alert_target_selectors()
        if selector.split("{")[0] in present
    }
    assert any(s.startswith("up{") for s in checks) and any("service=" in s for s in checks)
    suite = tmp_path / "alerts_selectors_test.yaml"
    suite.write_text(promtool_suite(series, checks))

    result = await anyio.run_process([binary, "test", "rules", str(suite)], check=False)

    assert result.returncode == 0, (result.stdout + result.stderr).decode()


async def scraped_behind_the_operator(stack: Stack) -> list[dict[str, str]]:
    """Every service's samples as Prometheus stores them, plus each target's ``up``, plus
    the collector's span metrics for the spans of the same traffic."""
    honor = honor_labels()
    series: list[dict[str, str]] = []
    for service in SERVICES:
        target = target_labels(service)
        series.append(series_line("up", target, 1.0))
        for name, labels, value in samples(await stack.scrape(service)):
            series.append(series_line(name, relabel(labels, target, honor=honor), value))
    collector = target_labels("otel-collector") | {"endpoint": "span-metrics"}
    for name, labels, value in span_metrics(stack.spans.get_finished_spans()):
        series.append(series_line(name, relabel(labels, collector, honor=False), value))
    return series


STATUS_CODES = {
    StatusCode.UNSET: "STATUS_CODE_UNSET",
    StatusCode.OK: "STATUS_CODE_OK",
    StatusCode.ERROR: "STATUS_CODE_ERROR",
}


def span_metrics(spans: Iterable[ReadableSpan]) -> Iterator[Sample]:
    """The calls and duration series the collector's spanmetrics connector exports through its
    Prometheus exporter for ``spans``, named, unit-suffixed and bucketed as configured."""
    config = yaml.safe_load((OBSERVABILITY / "collector-config.yaml").read_text())
    connector = config["connectors"]["spanmetrics"]
    prefix = connector["namespace"].replace(".", "_")
    unit = {"s": "seconds", "ms": "milliseconds"}[connector["histogram"]["unit"]]
    scale = 1e9 if unit == "seconds" else 1e6
    bounds = [go_duration(b) * 1e9 / scale for b in connector["histogram"]["explicit"]["buckets"]]
    groups: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for span in spans:
        service = str(span.resource.attributes.get("service.name", "unknown_service"))
        # In one process the provider names no service; name them as rgpu's processes are.
        labels = {
            "service_name": "rgpu-" + service if service.startswith("unknown") else service,
            "span_name": span.name,
            "span_kind": f"SPAN_KIND_{span.kind.name}",
            "status_code": STATUS_CODES[span.status.status_code],
            "job": service,
        }
        elapsed = ((span.end_time or 0) - (span.start_time or 0)) / scale
        groups.setdefault(tuple(sorted(labels.items())), []).append(elapsed)
    for key, durations in groups.items():
        labels = dict(key)
        yield f"{prefix}_calls_total", labels, float(len(durations))
        for bound in [*bounds, math.inf]:
            le = "+Inf" if bound == math.inf else repr(bound)
            count = float(sum(d <= bound for d in durations))
            yield f"{prefix}_duration_{unit}_bucket", {**labels, "le": le}, count
        yield f"{prefix}_duration_{unit}_count", labels, float(len(durations))
        yield f"{prefix}_duration_{unit}_sum", labels, sum(durations)


def go_duration(text: str) -> float:
    """Seconds in a Go duration such as ``2.5ms`` or ``1s`` (the collector's config syntax)."""
    match = re.fullmatch(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", text)
    assert match, text
    scale = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return float(match[1]) * scale[match[2]]


def alert_target_selectors() -> set[str]:
    """The alerts' vector selectors, keeping only their matchers on target labels."""
    rule = yaml.safe_load((OBSERVABILITY / "prometheusrule.yaml").read_text())
    selectors = set()
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            for name, body in re.findall(
                r"\b((?:rgpu|hami)_\w+|up)(?:\{([^}]*)\})?", alert["expr"]
            ):
                matchers = re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*("[^"]*")', body)
                kept = ", ".join(f"{k}{op}{v}" for k, op, v in matchers if k in TARGET_LABELS)
                selectors.add(f"{name}{{{kept}}}" if kept else name)
    return selectors


async def test_no_service_exports_a_label_that_would_override_the_targets_identity(
    stack: Stack, load_fixture: Load
) -> None:
    await drive_traffic(stack, load_fixture)
    identity = {"job", "instance", "container"}
    for service in SERVICES:
        clashes = {
            (name, key)
            for name, labels, _ in samples(await stack.scrape(service))
            for key in labels
            if key in identity
        }
        assert clashes == set(), f"{service} exports target-identity labels: {clashes}"


def test_the_relabeling_renames_a_clashing_label_unless_labels_are_honored() -> None:
    scraped = {"service": "extender", "route": "/filter"}
    target = target_labels("extender")

    assert relabel(scraped, target, honor=False)["exported_service"] == "extender"
    assert relabel(scraped, target, honor=False)["service"] == "rgpu-extender"
    assert relabel(scraped, target, honor=True)["service"] == "extender"
    assert relabel(scraped, target, honor=True)["job"] == "rgpu-extender"


async def test_card_series_keep_their_own_labels_behind_the_operator(
    stack: Stack, load_fixture: Load
) -> None:
    """HAMi's families keep ``endpoint`` (the lupine host:port), the holder series keep the
    holder's ``namespace`` and ``pod`` (not the exporting pod's)."""
    await drive_traffic(stack, load_fixture)
    target = target_labels("metrics")
    exported = list(samples(await stack.scrape("metrics")))
    cards = [s for s in exported if s[0].startswith(("hami_", "rgpu_card_holder"))]
    assert {name for name, _, _ in cards} >= {"hami_remote_gpu_allocated", "rgpu_card_holder_info"}
    for _, labels, _ in cards:
        relabeled = relabel(labels, target, honor=honor_labels())
        assert {k: relabeled[k] for k in labels} == labels
        assert not any(key.startswith("exported_") for key in relabeled)
    holders = [labels for name, labels, _ in cards if name == "rgpu_card_holder_info"]
    assert {(h["namespace"], h["pod"]) for h in holders} == {("ml-team", "trainer-0")}
    # Without honorLabels (the ServiceMonitor's comment says so): the Holders panel would name
    # the metrics pod as every card's holder, and HAMi's endpoint would be the port's name.
    dishonored = [relabel(h, target, honor=False) for h in holders]
    assert {(h["namespace"], h["pod"]) for h in dishonored} == {("rgpu-system", target["pod"])}
    assert {h["exported_pod"] for h in dishonored} == {"trainer-0"}
    hami = [
        relabel(labels, target, honor=False) for name, labels, _ in cards if "endpoint" in labels
    ]
    assert hami and all(h["endpoint"] == "http" and h["exported_endpoint"] for h in hami)


async def test_every_series_the_alerts_select_is_exported_by_a_service(
    stack: Stack, load_fixture: Load
) -> None:
    await drive_traffic(stack, load_fixture)
    exported = {name for service in SERVICES for name in declared(await stack.scrape(service))}
    rule = yaml.safe_load((OBSERVABILITY / "prometheusrule.yaml").read_text())
    selected = {
        name
        for group in rule["spec"]["groups"]
        for alert in group["rules"]
        for name in re.findall(r"\b(?:rgpu|hami)_\w+", alert["expr"])
    }

    assert selected, "the alert rules select no rgpu series"
    assert selected - exported == set()


LATENCY = re.compile(r"histogram_quantile\(.*_(bucket|seconds_bucket)\b")


def test_every_latency_panel_shows_exemplars_that_open_their_trace() -> None:
    dashboard = json.loads((OBSERVABILITY / "dashboard.json").read_text())
    latency = [
        (panel["title"], target)
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
        if LATENCY.search(target["expr"])
    ]
    assert len(latency) >= 4
    assert [title for title, target in latency if target.get("exemplar") is not True] == []
    sources = yaml.safe_load((OBSERVABILITY / "grafana-datasources.yaml").read_text())
    by_uid = {source["uid"]: source for source in sources["datasources"]}
    (chosen,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    prometheus = by_uid[chosen["current"]["value"]]
    (destination,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert destination["name"] == EXEMPLAR_TRACE_ID
    assert by_uid[destination["datasourceUid"]]["type"] == "tempo"


def test_the_error_panel_leaves_out_probe_answers() -> None:
    dashboard = json.loads((OBSERVABILITY / "dashboard.json").read_text())
    (errors,) = [p for p in dashboard["panels"] if p["title"] == "HTTP errors by service"]
    (target,) = errors["targets"]
    assert 'route!~"/readyz|/healthz"' in target["expr"]


async def test_discoverys_start_up_503_is_no_error_on_the_dashboard(tmp_path: Path) -> None:
    """Discovery answers /readyz 503 until its first Node list: the error panel stays empty."""
    binary = promtool()
    series = [
        series_line(
            "rgpu_http_request_duration_seconds_count",
            {"service": "discovery", "method": "GET", "route": "/readyz", "status": "503"},
            5.0,
        )
    ]
    dashboard = json.loads((OBSERVABILITY / "dashboard.json").read_text())
    (errors,) = [p for p in dashboard["panels"] if p["title"] == "HTTP errors by service"]
    expr = errors["targets"][0]["expr"].replace("$__rate_interval", "2m")
    test = {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [{"expr": expr, "eval_time": "1m", "exp_samples": []}],
    }
    suite = tmp_path / "errors_test.yaml"
    suite.write_text(yaml.safe_dump({"rule_files": [], "tests": [test]}, width=10_000))

    result = await anyio.run_process([binary, "test", "rules", str(suite)], check=False)

    assert result.returncode == 0, (result.stdout + result.stderr).decode()
