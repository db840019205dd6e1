"""The tracing half of the observability component fits together as rendered: the services
export to the collector, the collector's pipelines are whole and keep what the docs promise,
kept traces reach Tempo on a port it listens on, Grafana finds Tempo and the span metrics,
exemplars open their trace, and the NetworkPolicies let exactly that through.

The production overlay is rendered with ``kubectl kustomize`` (as ``test_manifests`` does);
the collector's and Tempo's own configurations are read from the ConfigMaps it generates.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from rgpu_runtime.settings import TraceSettings
from rgpu_runtime.telemetry import EXEMPLAR_TRACE_ID

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ROOT / "k8s" / "overlays" / "production"
NAMESPACE = "rgpu-system"

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def objects() -> list[Obj]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH: run `make setup` (it installs kubectl)")
    done = subprocess.run(
        [kubectl, "kustomize", str(PRODUCTION)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def get(objects: list[Obj], kind: str, name: str) -> Obj:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def config_map(objects: list[Obj], prefix: str) -> Obj:
    """A generated ConfigMap (its name carries a content hash)."""
    (found,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(prefix + "-")
    ]
    return found


def container(objects: list[Obj], deployment: str) -> Obj:
    (found,) = get(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return found


def container_port(objects: list[Obj], service: str, port: int) -> int:
    """The container port a Service's ``port`` reaches."""
    (entry,) = [p for p in get(objects, "Service", service)["spec"]["ports"] if p["port"] == port]
    target = entry["targetPort"]
    (pod_port,) = [
        p["containerPort"]
        for p in container(objects, service)["ports"]
        if target in (p["name"], p["containerPort"])
    ]
    return int(pod_port)


def collector(objects: list[Obj]) -> Obj:
    loaded: Obj = yaml.safe_load(config_map(objects, "rgpu-otel-collector")["data"]["config.yaml"])
    return loaded


def tempo(objects: list[Obj]) -> Obj:
    loaded: Obj = yaml.safe_load(config_map(objects, "rgpu-tempo")["data"]["tempo.yaml"])
    return loaded


def datasources(objects: list[Obj]) -> dict[str, Obj]:
    raw = config_map(objects, "rgpu-grafana-datasources")
    assert raw["metadata"]["labels"]["grafana_datasource"] == "1"
    loaded = yaml.safe_load(raw["data"]["rgpu-datasources.yaml"])
    return {source["uid"]: source for source in loaded["datasources"]}


def settings(objects: list[Obj]) -> dict[str, str]:
    found: dict[str, str] = config_map(objects, "rgpu-settings")["data"]
    return found


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_the_services_send_every_request_trace_and_a_tenth_of_the_background(
    objects: list[Obj],
) -> None:
    traces = TraceSettings.from_env(settings(objects))
    assert traces == TraceSettings(
        sampler="parentbased_traceidratio", ratio=1.0, background_ratio=0.1
    )


def test_every_collector_pipeline_is_whole_and_every_component_used(objects: list[Obj]) -> None:
    config = collector(objects)
    pipelines = config["service"]["pipelines"]
    defined = {
        kind: set(config.get(kind) or ())
        for kind in ("receivers", "processors", "exporters", "connectors")
    }
    used: dict[str, set[str]] = {kind: set() for kind in defined}
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            for name in pipeline.get(kind, ()):
                role = "connectors" if name in defined["connectors"] else kind
                assert name in defined[role], f"{name} is not defined"
                used[role].add(name)
    assert used == defined
    # The span-metrics connector sees every span (before sampling) and feeds a metrics pipeline.
    feeding = [p for p in pipelines.values() if "spanmetrics" in p.get("exporters", ())]
    assert feeding and all("tail_sampling" not in p.get("processors", ()) for p in feeding)
    assert any("spanmetrics" in p.get("receivers", ()) for p in pipelines.values())


def test_the_tail_sampler_keeps_errors_slow_traces_and_every_pods_story(objects: list[Obj]) -> None:
    policies = {p["type"]: p for p in collector(objects)["processors"]["tail_sampling"]["policies"]}
    assert policies["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    assert policies["latency"]["latency"]["threshold_ms"] <= 1000
    story = policies["string_attribute"]["string_attribute"]
    assert (story["key"], story["values"], story["enabled_regex_matching"]) == (
        "k8s.pod.uid",
        [".+"],
        True,
    )
    assert 0 < policies["probabilistic"]["probabilistic"]["sampling_percentage"] < 100


def test_kept_traces_reach_tempo_on_the_port_it_receives_on(objects: list[Obj]) -> None:
    exporter = collector(objects)["exporters"]["otlp/tempo"]
    host, port = exporter["endpoint"].rsplit(":", 1)
    assert host == f"rgpu-tempo.{NAMESPACE}.svc"
    grpc = tempo(objects)["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert container_port(objects, "rgpu-tempo", int(port)) == port_of(grpc)


def test_grafana_reads_tempo_and_exemplars_open_the_trace_there(objects: list[Obj]) -> None:
    sources = datasources(objects)
    traces = sources["rgpu-tempo"]
    assert traces["type"] == "tempo"
    url = urlsplit(traces["url"])
    assert url.hostname == f"rgpu-tempo.{NAMESPACE}.svc"
    http = tempo(objects)["server"]["http_listen_port"]
    assert container_port(objects, "rgpu-tempo", url.port or 80) == http
    metrics = sources["rgpu-prometheus"]
    assert metrics["type"] == "prometheus"
    (destination,) = metrics["jsonData"]["exemplarTraceIdDestinations"]
    assert destination == {"name": EXEMPLAR_TRACE_ID, "datasourceUid": "rgpu-tempo"}


def test_prometheus_scrapes_the_span_metrics_the_collector_exports(objects: list[Obj]) -> None:
    monitor = get(objects, "ServiceMonitor", "rgpu-span-metrics")
    (endpoint,) = monitor["spec"]["endpoints"]
    service = get(objects, "Service", "rgpu-otel-collector")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    exported = collector(objects)["exporters"]["prometheus"]
    assert exported["enable_open_metrics"] is True, "exemplars need the OpenMetrics format"
    assert container_port(objects, "rgpu-otel-collector", port["port"]) == port_of(
        exported["endpoint"]
    )


def ingress_ports(objects: list[Obj], app: str) -> Iterator[tuple[Obj, int]]:
    for policy in objects:
        if policy["kind"] != "NetworkPolicy":
            continue
        selector = policy["spec"]["podSelector"].get("matchLabels") or {}
        if (
            selector.get("app.kubernetes.io/name") == app
            and "Ingress" in policy["spec"]["policyTypes"]
        ):
            for rule in policy["spec"].get("ingress") or ():
                for port in rule.get("ports") or ():
                    yield rule, port["port"]


def test_network_policies_open_tempo_and_the_span_metrics_to_their_readers_only(
    objects: list[Obj],
) -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"rgpu.io/monitoring": "enabled"}}}
    tempo_rules = {port: rule for rule, port in ingress_ports(objects, "rgpu-tempo")}
    assert set(tempo_rules) == {
        p["containerPort"] for p in container(objects, "rgpu-tempo")["ports"]
    }
    assert tempo_rules[3200]["from"] == [monitoring]
    assert tempo_rules[4317]["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "rgpu-otel-collector"}}}
    ]
    collector_rules = {port: rule for rule, port in ingress_ports(objects, "rgpu-otel-collector")}
    assert collector_rules[8889]["from"] == [monitoring]
    assert {4317, 4318, 8889} == set(collector_rules)


def test_the_collector_and_tempo_run_one_replica_each(objects: list[Obj]) -> None:
    for name in ("rgpu-otel-collector", "rgpu-tempo"):
        assert get(objects, "Deployment", name)["spec"]["replicas"] == 1, name
    assert get(objects, "Deployment", "rgpu-tempo")["spec"]["strategy"]["type"] == "Recreate"
