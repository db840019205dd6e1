"""The Kustomize tree in k8s/ and docker/Dockerfile are code nobody runs
in CI against a real cluster, so their mistakes would only show at deploy time. These tests
render every overlay with ``kubectl kustomize``, validate each object against the Kubernetes
1.31 and 1.34 schemas, and check what the schemas cannot: that names, ports, URLs, resource
names and service accounts agree across objects and with the settings the services parse,
that every RBAC rule is used by the service's code (and every API call the code makes is
granted), that every container is locked down, and that each image holds one service only.
"""

from __future__ import annotations

import ast
import base64
import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import kubernetes_validate
import orjson
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes_asyncio.client import (
    AuthenticationV1Api,
    CoordinationV1Api,
    CoreV1Api,
    EventsV1Api,
    NetworkingV1Api,
    PolicyV1Api,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_allocator.policy_objects import DISCOVERY_LABELS
from rgpu_allocator.settings import AllocatorSettings
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import run_apiserver
from rgpu_kubesim.certs import write_certs
from rgpu_runtime.peers import audience_of
from rgpu_runtime.serving import Listener, running
from rgpu_runtime.settings import Settings
from rgpu_sim.stack import (
    MATCH_CONDITION,
    MATCH_CONDITION_NAME,
    SKIP_CONDITION,
    SKIP_CONDITION_NAME,
    SUBRESOURCE_MATCH_CONDITION,
    SUBRESOURCE_MATCH_CONDITION_NAME,
)
from rgpu_sim.stack_network import STANDING_POLICY

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "k8s"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / "docker" / "Dockerfile.dockerignore"

NAMESPACE = "rgpu-system"
DEV_CERTS = "generated-by-make-dev-certs"
"""Where `make dev-certs` writes the dev overlay's webhook certificate."""
SERVICES = ("discovery", "allocator", "extender", "metrics")
API_CLIENTS = ["discovery", "allocator", "extender", "metrics"]
"""The services that call the Kubernetes API (metrics only for its leader election)."""
RECEIVERS = ("allocator", "discovery")
"""Services with guarded routes (docs/design.md §10): they confirm callers' tokens with
TokenReview."""
CALLERS = {"extender": "allocator", "allocator": "discovery"}
"""Services that call a guarded route, and whose (extender: the allocator's writes; allocator:
discovery's probe): each sends a projected token of the receiving service's audience."""
OWNED_ANNOTATIONS = {"hami.io/remote-gpu-devices-", "hami.io/lupine-endpoint", "rgpu.io/"}
"""Scheduler-owned annotation names and prefixes (docs/design.md §3) the webhook must be sent."""
OVERLAYS = ("dev", "production")
ALL_COMPONENTS = "all-components"
"""A throwaway overlay (base + every component) so components no overlay uses are checked too."""
RENDERS = (*OVERLAYS, ALL_COMPONENTS)
KUBERNETES_VERSIONS = ("1.31.0", "1.34.0")
"""kubernetes-validate ships x.y.0 schemas; these are the nearest to 1.31 and 1.34."""

CRD_KINDS = frozenset(
    {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
        ("cert-manager.io/v1", "Issuer"),
        ("cert-manager.io/v1", "Certificate"),
    }
)
"""Kinds from CRDs, which the core schemas cannot know; nothing else may skip validation."""

DEV_TOOLS = (
    "pytest",
    "pytest-timeout",
    "hypothesis",
    "mypy",
    "ruff",
    "import-linter",
    "kubernetes-validate",
    "asgi-lifespan",
    "jsonpatch",
    "types-pyyaml",
)

Obj = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Rendering


@pytest.fixture(scope="session")
def k8s_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """k8s/ copied aside, with the dev certificate the README's command writes, and the
    all-components overlay; the work tree itself is never written to."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns(DEV_CERTS))
    write_certs(
        tree / "overlays" / "dev" / DEV_CERTS,
        hosts=(),
        dns_names=("rgpu-extender.rgpu-system.svc",),
    )
    _write_all_components_overlay(tree / "overlays" / ALL_COMPONENTS)
    return tree


def _write_all_components_overlay(directory: Path) -> None:
    components = sorted(p.name for p in (K8S / "components").iterdir() if p.is_dir())
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../base"],
        "components": [f"../../components/{name}" for name in components],
        "images": [
            {"name": f"ghcr.io/rgpu/{name}", "newTag": "test"}
            for name in (*(f"rgpu-{s}" for s in SERVICES), "lupine-server")
        ],
    }
    directory.mkdir(parents=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))


@pytest.fixture(scope="session")
def rendered(k8s_copy: Path) -> Mapping[str, list[Obj]]:
    return {name: _kustomize(k8s_copy / "overlays" / name) for name in RENDERS}


def _kustomize(directory: Path) -> list[Obj]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH: run `make setup` (it installs kubectl)")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory.name} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@dataclass(frozen=True, slots=True)
class Render:
    """One overlay's objects with the lookups the checks need."""

    objects: list[Obj]

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> Obj:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name!r}, found {len(found)}"
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        return any(o["metadata"]["name"] == name for o in self.of_kind(kind))

    def deployment(self, service: str) -> Obj:
        return self.get("Deployment", f"rgpu-{service}")

    def container(self, service: str) -> Obj:
        containers: list[Obj] = self.deployment(service)["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1, f"rgpu-{service} should run one container"
        return containers[0]

    def settings(self) -> dict[str, str]:
        maps = [o for o in self.of_kind("ConfigMap") if _is_settings(o)]
        assert len(maps) == 1, "expected exactly one rgpu-settings ConfigMap"
        return dict(maps[0].get("data") or {})

    def settings_name(self) -> str:
        return str(
            next(o for o in self.of_kind("ConfigMap") if _is_settings(o))["metadata"]["name"]
        )

    def scheduler_config(self) -> Obj:
        volumes = self.deployment("scheduler")["spec"]["template"]["spec"]["volumes"]
        name = next(v["configMap"]["name"] for v in volumes if "configMap" in v)
        loaded: Obj = yaml.safe_load(self.get("ConfigMap", name)["data"]["config.yaml"])
        return loaded

    def webhook(self) -> Obj:
        """The webhook for pods themselves (CREATE, UPDATE)."""
        return self.webhooks()[0]

    def subresource_webhook(self) -> Obj:
        """The webhook for the pod subresources that carry the whole pod."""
        return self.webhooks()[1]

    def webhooks(self) -> list[Obj]:
        configuration = self.get("MutatingWebhookConfiguration", "rgpu-extender")
        webhooks: list[Obj] = configuration["webhooks"]
        names = [w["name"] for w in webhooks]
        assert names == ["pods.webhook.rgpu.io", "pods-subresources.webhook.rgpu.io"], names
        return webhooks


def _is_settings(obj: Obj) -> bool:
    return re.fullmatch(r"rgpu-settings(-[a-z0-9]{10})?", obj["metadata"]["name"]) is not None


@pytest.fixture(scope="session", params=RENDERS)
def render(request: pytest.FixtureRequest, rendered: Mapping[str, list[Obj]]) -> Render:
    return Render(rendered[request.param])


@pytest.fixture(scope="session", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest, rendered: Mapping[str, list[Obj]]) -> Render:
    return Render(rendered[request.param])


@pytest.fixture(scope="session")
def dev(rendered: Mapping[str, list[Obj]]) -> Render:
    return Render(rendered["dev"])


@pytest.fixture(scope="session")
def production(rendered: Mapping[str, list[Obj]]) -> Render:
    return Render(rendered["production"])


@pytest.fixture(scope="session")
def everything(rendered: Mapping[str, list[Obj]]) -> Render:
    return Render(rendered[ALL_COMPONENTS])


def pod_specs(render: Render) -> Iterator[tuple[str, Obj]]:
    for obj in render.objects:
        if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def containers(spec: Obj) -> Iterator[Obj]:
    yield from spec.get("initContainers") or ()
    yield from spec["containers"]


# ---------------------------------------------------------------------------------------------
# Schemas


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_strictly_against_the_kubernetes_schema(
    render: Render, version: str
) -> None:
    failures = []
    for obj in render.objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            failures.append(f"{where}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            failures.append(f"{where}: no {version} schema for {obj['apiVersion']}; a CRD kind?")
    assert not failures, "\n".join(failures)


def test_strict_validation_refuses_an_unknown_field() -> None:
    deployment = _base_object("discovery/deployment.yaml")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize(("api_version", "kind"), sorted(CRD_KINDS))
def test_skipped_crd_kinds_have_no_core_schema_and_are_rendered(
    rendered: Mapping[str, list[Obj]], api_version: str, kind: str
) -> None:
    obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)
    assert any(
        (o["apiVersion"], o["kind"]) == (api_version, kind)
        for objs in rendered.values()
        for o in objs
    ), f"{kind} is skipped but rendered nowhere: drop it from CRD_KINDS"


def _base_object(relative: str) -> Obj:
    loaded: Obj = yaml.safe_load((K8S / "base" / relative).read_text())
    return loaded


# ---------------------------------------------------------------------------------------------
# Namespaces and names


def test_namespaced_objects_live_in_rgpu_system_unless_they_must_live_elsewhere(
    render: Render,
) -> None:
    elsewhere = {
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"))
        for o in render.objects
        if o["metadata"].get("namespace") not in (None, NAMESPACE)
    }
    allowed = {
        ("RoleBinding", "rgpu-scheduler-authentication-reader", "kube-system"),
        ("DaemonSet", "lupine-server", "rgpu-lupine"),
        # The server-policies component: the allocator's grant and the standing policy live
        # where the lupine pods they are about do.
        ("Role", "rgpu-allocator-server-policies", "rgpu-lupine"),
        ("RoleBinding", "rgpu-allocator-server-policies", "rgpu-lupine"),
        ("NetworkPolicy", "rgpu-lupine-probes-only", "rgpu-lupine"),
    }
    assert elsewhere <= allowed


def test_rgpu_namespace_enforces_the_restricted_pod_security_level(render: Render) -> None:
    labels = render.get("Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


# ---------------------------------------------------------------------------------------------
# Containers


def test_every_container_has_probes_resources_and_a_locked_down_security_context(
    render: Render,
) -> None:
    problems = [
        f"{where} {c['name']}: {problem}"
        for where, spec in pod_specs(render)
        for c in containers(spec)
        for problem in _container_problems(spec, c)
    ]
    assert not problems, "\n".join(problems)


def _container_problems(spec: Obj, container: Obj) -> Iterator[str]:
    pod = spec.get("securityContext") or {}
    ctx = container.get("securityContext") or {}
    for probe in ("livenessProbe", "readinessProbe"):
        if probe not in container:
            yield f"no {probe}"
    resources = container.get("resources") or {}
    for kind, key in (("requests", "cpu"), ("requests", "memory"), ("limits", "memory")):
        if key not in (resources.get(kind) or {}):
            yield f"no resources.{kind}.{key}"
    if ctx.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
        yield "runAsNonRoot is not true"
    if ctx.get("runAsUser", pod.get("runAsUser", 0)) == 0:
        yield "runs as uid 0 (set a non-zero runAsUser)"
    if ctx.get("readOnlyRootFilesystem") is not True:
        yield "readOnlyRootFilesystem is not true"
    if ctx.get("allowPrivilegeEscalation") is not False:
        yield "allowPrivilegeEscalation is not false"
    if ctx.get("privileged"):
        yield "privileged"
    if (ctx.get("capabilities") or {}).get("drop") != ["ALL"]:
        yield "capabilities.drop is not [ALL]"
    if (ctx.get("capabilities") or {}).get("add"):
        yield "capabilities.add is not empty"
    seccomp = ctx.get("seccompProfile") or pod.get("seccompProfile") or {}
    if seccomp.get("type") != "RuntimeDefault":
        yield "seccompProfile is not RuntimeDefault"


def test_every_rendered_image_is_pinned_to_a_tag_or_digest(render: Render) -> None:
    untagged = [
        c["image"]
        for _, spec in pod_specs(render)
        for c in containers(spec)
        if not re.search(r"(:[\w][\w.-]*|@sha256:[0-9a-f]{64})$", c["image"].split("/")[-1])
    ]
    assert not untagged


@pytest.mark.parametrize("service", SERVICES)
def test_service_probes_healthz_for_liveness_and_readyz_for_readiness(
    render: Render, service: str
) -> None:
    container = render.container(service)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # A scheduler listener that requires client certificates cannot be probed by the kubelet
    # (it presents none): the extender is probed on its webhook listener over TLS then.
    mtls = service == "extender" and "RGPU_SCHEDULER_CLIENT_CA_FILE" in _environment(
        render, service
    )
    port, scheme = ("webhook", "HTTPS") if mtls else ("http", "HTTP")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert _container_port(container, get["port"]) == _port_of(container, port)
        assert get.get("scheme", "HTTP") == scheme


@pytest.mark.parametrize("service", SERVICES)
def test_service_reads_the_settings_configmap_and_its_namespace_from_the_downward_api(
    render: Render, service: str
) -> None:
    container = render.container(service)
    sources = [e["configMapRef"]["name"] for e in container.get("envFrom") or ()]
    assert sources == [render.settings_name()]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


@pytest.mark.parametrize("service", SERVICES)
def test_service_runs_its_own_image_under_its_own_service_account(
    render: Render, service: str
) -> None:
    spec = render.deployment(service)["spec"]["template"]["spec"]
    image = render.container(service)["image"]
    assert image.rpartition(":")[0] == f"ghcr.io/rgpu/rgpu-{service}"
    assert spec["serviceAccountName"] == f"rgpu-{service}"
    assert render.has("ServiceAccount", f"rgpu-{service}")


def _port_of(container: Obj, name: str) -> int:
    ports = [p["containerPort"] for p in container.get("ports") or () if p.get("name") == name]
    assert len(ports) == 1, f"container {container['name']} has no single port named {name!r}"
    return int(ports[0])


def _container_port(container: Obj, port: int | str) -> int:
    return _port_of(container, port) if isinstance(port, str) else port


# ---------------------------------------------------------------------------------------------
# Settings: what the services will parse at start


def _environment(render: Render, service: str) -> dict[str, str]:
    environ = dict(render.settings())
    for entry in render.container(service)["env"]:
        if "value" in entry:
            environ[entry["name"]] = entry["value"]
        elif entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace":
            environ[entry["name"]] = render.deployment(service)["metadata"]["namespace"]
    return environ


@pytest.mark.parametrize("service", SERVICES)
def test_service_settings_parse_and_listen_on_the_container_port(
    render: Render, service: str
) -> None:
    settings = Settings.from_env(_environment(render, service), service=service)
    assert settings.http.listen.host == "0.0.0.0"
    assert settings.http.listen.port == _port_of(render.container(service), "http")


def test_extender_webhook_listens_with_tls_from_the_mounted_secret(render: Render) -> None:
    settings = ExtenderSettings.from_env(_environment(render, "extender"))
    container = render.container("extender")
    assert settings.edge.webhook_listen.port == _port_of(container, "webhook")
    mount = _secret_mount(render, "rgpu-extender-webhook-tls")
    assert settings.edge.tls_cert_file == f"{mount}/tls.crt"
    assert settings.edge.tls_key_file == f"{mount}/tls.key"


def _secret_mount(render: Render, secret_prefix: str) -> str:
    spec = render.deployment("extender")["spec"]["template"]["spec"]
    volume = next(
        v["name"]
        for v in spec["volumes"]
        if v.get("secret", {}).get("secretName", "").startswith(secret_prefix)
    )
    mounts = render.container("extender")["volumeMounts"]
    return str(next(m["mountPath"] for m in mounts if m["name"] == volume))


def test_webhook_secret_is_supplied_by_the_overlay(overlay: Render) -> None:
    spec = overlay.deployment("extender")["spec"]["template"]["spec"]
    names = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    issued = {c["spec"]["secretName"] for c in overlay.objects if c["kind"] == "Certificate"}
    generated = {s["metadata"]["name"] for s in overlay.of_kind("Secret")}
    assert names <= issued | generated


@pytest.mark.parametrize(
    ("key", "service"), [("RGPU_DISCOVERY_URL", "discovery"), ("RGPU_ALLOCATOR_URL", "allocator")]
)
def test_peer_urls_point_at_the_service_port_of_the_peer(
    render: Render, key: str, service: str
) -> None:
    _assert_url_reaches(render, render.settings()[key], service, "http")


def _assert_url_reaches(render: Render, url: str, service: str, port_name: str) -> None:
    parts = urlsplit(url)
    assert parts.hostname in (
        f"rgpu-{service}.{NAMESPACE}.svc",
        f"rgpu-{service}.{NAMESPACE}.svc.cluster.local",
    ), f"{url} does not name the rgpu-{service} Service"
    port = _service_port(render, f"rgpu-{service}", parts.port)
    assert _container_port(render.container(service), port["targetPort"]) == _port_of(
        render.container(service), port_name
    )


def _service_port(render: Render, service_name: str, port: int | None) -> Obj:
    svc = render.get("Service", service_name)
    matches = [p for p in svc["spec"]["ports"] if p["port"] == port]
    assert matches, f"Service {service_name} has no port {port}"
    return dict(matches[0])


def test_trusted_users_are_the_allocator_and_extender_service_accounts(render: Render) -> None:
    users = {u.strip() for u in render.settings()["RGPU_TRUSTED_USERS"].split(",")}
    expected = {f"system:serviceaccount:{NAMESPACE}:rgpu-{s}" for s in ("allocator", "extender")}
    assert users == expected
    for service in ("allocator", "extender"):
        spec = render.deployment(service)["spec"]["template"]["spec"]
        assert f"system:serviceaccount:{NAMESPACE}:{spec['serviceAccountName']}" in users


# ---------------------------------------------------------------------------------------------
# The second scheduler


def test_scheduler_managed_resources_are_the_configmap_resource_names_ignored_by_the_scheduler(
    render: Render,
) -> None:
    (extender,) = render.scheduler_config()["extenders"]
    settings = render.settings()
    names = {settings["RGPU_RESOURCE_COUNT"], settings["RGPU_RESOURCE_MEMORY"]}
    managed = extender["managedResources"]
    assert {m["name"] for m in managed} == names
    assert all(m["ignoredByScheduler"] is True for m in managed)


def test_scheduler_extender_url_reaches_the_extender_port(render: Render) -> None:
    (extender,) = render.scheduler_config()["extenders"]
    scheme = urlsplit(extender["urlPrefix"]).scheme
    assert extender["enableHTTPS"] is (scheme == "https")
    _assert_url_reaches(render, extender["urlPrefix"], "extender", "http")


def test_in_every_overlay_kube_scheduler_presents_a_client_certificate_the_extender_requires(
    overlay: Render,
) -> None:
    (extender,) = overlay.scheduler_config()["extenders"]
    assert extender["urlPrefix"].startswith("https://") and extender["enableHTTPS"] is True
    tls = extender["tlsConfig"]
    mount = _mount_of_secret(overlay, "scheduler", "rgpu-scheduler-client-tls")
    assert (tls["certFile"], tls["keyFile"], tls["caFile"]) == (
        f"{mount}/tls.crt",
        f"{mount}/tls.key",
        f"{mount}/ca.crt",
    )
    settings = ExtenderSettings.from_env(_environment(overlay, "extender"))
    extender_tls = _secret_mount(overlay, "rgpu-extender-webhook-tls")
    assert settings.edge.scheduler_client_ca_file == f"{extender_tls}/ca.crt"
    assert settings.edge.tls_cert_file == f"{extender_tls}/tls.crt"


def test_the_dev_client_certificate_is_signed_by_the_ca_the_extender_trusts(dev: Render) -> None:
    def secret(prefix: str) -> Obj:
        return next(
            o
            for o in dev.objects
            if o["kind"] == "Secret" and o["metadata"]["name"].startswith(prefix)
        )

    client, serving = secret("rgpu-scheduler-client-tls"), secret("rgpu-extender-webhook-tls")
    assert client["data"]["ca.crt"] == serving["data"]["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(client["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(client["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage


def test_production_issues_the_scheduler_client_certificate_from_the_serving_ca(
    production: Render,
) -> None:
    client = production.get("Certificate", "rgpu-scheduler-client")
    serving = production.get("Certificate", "rgpu-extender-webhook")
    assert client["spec"]["secretName"] == "rgpu-scheduler-client-tls"
    assert "client auth" in client["spec"]["usages"]
    # One CA signs both sides, so each verifies the other with the same ca.crt.
    assert client["spec"]["issuerRef"] == serving["spec"]["issuerRef"]
    settings = ExtenderSettings.from_env(_environment(production, "extender"))
    extender_tls = _secret_mount(production, "rgpu-extender-webhook-tls")
    assert settings.edge.scheduler_client_ca_file == f"{extender_tls}/ca.crt"
    assert settings.edge.tls_cert_file == f"{extender_tls}/tls.crt"


def _mount_of_secret(render: Render, service: str, secret: str) -> str:
    spec = render.deployment(service)["spec"]["template"]["spec"]
    # A generated Secret (the dev overlay's) carries a hash suffix.
    (volume,) = [
        v["name"]
        for v in spec["volumes"]
        if v.get("secret", {}).get("secretName", "").startswith(secret)
    ]
    (mount,) = [
        m["mountPath"]
        for c in spec["containers"]
        for m in c.get("volumeMounts") or ()
        if m["name"] == volume
    ]
    return str(mount)


def test_scheduler_extender_calls_filter_prioritize_and_bind_with_node_names(
    render: Render,
) -> None:
    (extender,) = render.scheduler_config()["extenders"]
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["weight"] > 0
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False


def test_scheduler_http_timeout_exceeds_the_extender_budget(render: Render) -> None:
    (extender,) = render.scheduler_config()["extenders"]
    timeout = _duration_seconds(extender["httpTimeout"])
    assert timeout > float(render.settings()["RGPU_EXTENDER_BUDGET_SECONDS"])


def _duration_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    assert match, f"httpTimeout {text!r} is not a Go duration like 5s"
    return float(match[1]) * units[match[2]]


def test_scheduler_profile_is_the_scheduler_name_the_webhook_sets(render: Render) -> None:
    config = render.scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert [p["schedulerName"] for p in config["profiles"]] == [
        render.settings()["RGPU_SCHEDULER_NAME"]
    ]


def test_scheduler_retries_refused_pods_within_two_seconds(render: Render) -> None:
    assert render.scheduler_config()["podMaxBackoffSeconds"] <= 2


def test_scheduler_leader_election_uses_its_own_lease_granted_by_its_role(
    render: Render,
) -> None:
    election = render.scheduler_config()["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceLock"] == "leases"
    assert (election["resourceNamespace"], election["resourceName"]) == (
        NAMESPACE,
        "rgpu-scheduler",
    )
    granted = _granted(render, "rgpu-scheduler", election["resourceNamespace"])
    for verb in ("get", "update", "create"):
        assert any(
            g.group == "coordination.k8s.io"
            and g.resource == "leases"
            and g.verb == verb
            and g.name in ("", election["resourceName"])
            for g in granted
        ), f"rgpu-scheduler cannot {verb} its Lease"


def test_scheduler_is_bound_to_the_upstream_scheduler_roles(render: Render) -> None:
    refs = {
        (b["roleRef"]["kind"], b["roleRef"]["name"]) for b in _bindings_of(render, "rgpu-scheduler")
    }
    assert {
        ("ClusterRole", "system:kube-scheduler"),
        ("ClusterRole", "system:volume-scheduler"),
        ("Role", "extension-apiserver-authentication-reader"),
        ("Role", "rgpu-scheduler-leader-election"),
    } == refs


def test_scheduler_image_is_a_pinned_upstream_kube_scheduler(render: Render) -> None:
    (container,) = render.deployment("scheduler")["spec"]["template"]["spec"]["containers"]
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.3[1-4]\.\d+", container["image"])


# ---------------------------------------------------------------------------------------------
# The webhook


@pytest.mark.parametrize("index", [0, 1])
def test_webhook_calls_the_extender_webhook_port_at_mutate(render: Render, index: int) -> None:
    service = render.webhooks()[index]["clientConfig"]["service"]
    assert (service["namespace"], service["name"], service["path"]) == (
        NAMESPACE,
        "rgpu-extender",
        "/mutate",
    )
    port = _service_port(render, "rgpu-extender", service["port"])
    container = render.container("extender")
    assert _container_port(container, port["targetPort"]) == _port_of(container, "webhook")


def test_webhook_fails_closed_quickly_on_pod_create_and_update(render: Render) -> None:
    webhook = render.webhook()
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "None"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["timeoutSeconds"] <= 5
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    (rule,) = webhook["rules"]
    assert (rule["apiGroups"], rule["resources"]) == ([""], ["pods"])
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]


def test_the_subresource_webhook_guards_status_and_ephemeral_containers_failing_closed(
    render: Render,
) -> None:
    webhook = render.subresource_webhook()
    assert (webhook["failurePolicy"], webhook["sideEffects"]) == ("Fail", "None")
    assert webhook["timeoutSeconds"] <= 5
    assert webhook["reinvocationPolicy"] == "Never"
    (rule,) = webhook["rules"]
    assert rule["operations"] == ["UPDATE"]
    assert sorted(rule["resources"]) == ["pods/ephemeralcontainers", "pods/status"]
    assert webhook["namespaceSelector"] == render.webhook()["namespaceSelector"]
    (condition,) = webhook["matchConditions"]
    quoted = set(re.findall(r"'([^']+)'", condition["expression"]))
    assert quoted == OWNED_ANNOTATIONS | {"LUPINE_"}


@pytest.mark.parametrize("index", [0, 1])
def test_webhook_leaves_out_kube_system_and_opted_out_namespaces_only(
    render: Render, index: int
) -> None:
    expressions = render.webhooks()[index]["namespaceSelector"]["matchExpressions"]
    by_key = {e["key"]: e for e in expressions}
    names = by_key["kubernetes.io/metadata.name"]
    assert names["operator"] == "NotIn"
    # rgpu's own namespace is judged too: a forged pod there must be refused like anywhere.
    assert names["values"] == ["kube-system"]
    assert (by_key["rgpu.io/webhook"]["operator"], by_key["rgpu.io/webhook"]["values"]) == (
        "NotIn",
        ["ignore"],
    )


def test_webhook_match_condition_names_the_configmap_resources_and_the_owned_annotations(
    render: Render,
) -> None:
    (condition, _) = render.webhook()["matchConditions"]
    quoted = set(re.findall(r"'([^']+)'", condition["expression"]))
    settings = render.settings()
    resources = {settings["RGPU_RESOURCE_COUNT"], settings["RGPU_RESOURCE_MEMORY"]}
    # "remote" and "gpu" send look-alike resource names too, for the webhook to warn about.
    assert quoted == resources | OWNED_ANNOTATIONS | {"(?i)remote", "(?i)gpu", "LUPINE_"}
    assert "oldObject" in condition["expression"]


@dataclass
class _Hook:
    """A webhook that admits everything and records which pods it was sent."""

    sent: list[str]

    async def mutate(self, request: Request) -> Response:
        review = orjson.loads(await request.body())["request"]
        self.sent.append(
            f"{review['operation']} {review['name'] or review['object']['metadata']['name']}"
        )
        answer = {"uid": review["uid"], "allowed": True}
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
        return Response(orjson.dumps(body | {"response": answer}), media_type="application/json")


def _pod(
    name: str,
    *,
    limits: Obj | None = None,
    annotations: Obj | None = None,
    env: list[Obj] | None = None,
) -> Obj:
    container: Obj = {"name": "c", "image": "busybox:1.36"}
    if limits is not None:
        container["resources"] = {"limits": limits}
    if env is not None:
        container["env"] = env
    metadata: Obj = {"name": name}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [container]},
    }


@pytest.mark.anyio
async def test_the_apiserver_sends_exactly_gpu_pods_lupine_pods_and_owned_annotation_changes(
    dev: Render, tmp_path: Path
) -> None:
    """The rendered configuration, evaluated by the simulated apiserver's real CEL."""
    files = write_certs(tmp_path, hosts=("127.0.0.1",))
    hook = _Hook(sent=[])
    app = Starlette(routes=[Route("/mutate", hook.mutate, methods=["POST"])])
    configuration = copy.deepcopy(dev.get("MutatingWebhookConfiguration", "rgpu-extender"))
    listener = Listener(
        listen="127.0.0.1:0", ssl_certfile=str(files.cert), ssl_keyfile=str(files.key)
    )
    pods = "/api/v1/namespaces/ml-team/pods"
    async with running(app, listener) as (url,), run_apiserver() as sim:
        for webhook in configuration["webhooks"]:
            webhook["clientConfig"] = {"url": f"{url}/mutate", "caBundle": files.ca_bundle()}
        async with httpx.AsyncClient(base_url=sim.url) as api:
            await api.post("/api/v1/namespaces", json={"metadata": {"name": "ml-team"}})
            admission = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
            accepted = await api.post(admission, json=configuration)
            assert accepted.status_code == 201, accepted.text
            gpu = _pod("gpu", limits={dev.settings()["RGPU_RESOURCE_COUNT"]: "1"})
            forged = _pod("forged", annotations={"hami.io/remote-gpu-devices-allocated": "x"})
            endpoint = _pod("endpoint", annotations={"hami.io/lupine-endpoint": "10.0.0.1"})
            steered = _pod("steered", annotations={"rgpu.io/retry-at": "1"})
            plain = _pod("plain", annotations={"example.com/note": "hi"})
            typo = _pod("typo", limits={"nvidia.com/Remote-GPUs": "1"})
            local = _pod("local", limits={"nvidia.com/gpu": "1"})
            pointed = _pod("pointed", env=[{"name": "LUPINE_SERVER", "value": "10.0.0.9:14833"}])
            for body in (gpu, forged, endpoint, steered, plain, typo, local, pointed):
                created = await api.post(pods, json=body)
                assert created.status_code == 201, created.text
            # Removing an owned annotation is seen through the old object.
            current = (await api.get(f"{pods}/steered")).json()
            current["metadata"]["annotations"] = {}
            assert (await api.put(f"{pods}/steered", json=current)).status_code == 200
            # An unrelated change to an ordinary pod is never sent.
            current = (await api.get(f"{pods}/plain")).json()
            current["metadata"]["labels"] = {"a": "b"}
            assert (await api.put(f"{pods}/plain", json=current)).status_code == 200
            # Through pods/status: a status change alone is never sent, an owned annotation is.
            current = (await api.get(f"{pods}/gpu")).json()
            current["status"] = {"phase": "Running"}
            assert (await api.put(f"{pods}/gpu/status", json=current)).status_code == 200
            current = (await api.get(f"{pods}/gpu")).json()
            current["metadata"]["annotations"] = {"hami.io/lupine-endpoint": "10.0.0.1:1"}
            await api.put(f"{pods}/gpu/status", json=current)
    assert hook.sent == [
        "CREATE gpu",
        "CREATE forged",
        "CREATE endpoint",
        "CREATE steered",
        "CREATE typo",
        "CREATE pointed",
        "UPDATE steered",
        "UPDATE gpu",
    ]


def test_dev_webhook_trusts_the_ca_of_the_generated_certificate(
    dev: Render, k8s_copy: Path
) -> None:
    bundle = dev.webhook()["clientConfig"]["caBundle"]
    ca = (k8s_copy / "overlays" / "dev" / DEV_CERTS / "ca.pem").read_bytes()
    assert base64.b64decode(bundle) == ca


def test_production_webhook_ca_is_injected_from_the_certificate_the_extender_mounts(
    production: Render,
) -> None:
    annotation = production.get("MutatingWebhookConfiguration", "rgpu-extender")["metadata"][
        "annotations"
    ]["cert-manager.io/inject-ca-from"]
    namespace, _, name = annotation.partition("/")
    certificate = production.get("Certificate", name)
    assert certificate["metadata"]["namespace"] == namespace
    assert "rgpu-extender.rgpu-system.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["secretName"] == "rgpu-extender-webhook-tls"
    assert "caBundle" not in production.webhook()["clientConfig"]


# ---------------------------------------------------------------------------------------------
# RBAC: least privilege, justified by the code


@dataclass(frozen=True, slots=True)
class Grant:
    """One (apiGroup, resource, verb) a role allows, optionally for one object name."""

    group: str
    resource: str
    verb: str
    name: str = ""


def _bindings_of(render: Render, account: str) -> list[Obj]:
    return [
        b
        for b in render.objects
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for s in b.get("subjects") or ()
        if s["kind"] == "ServiceAccount" and (s["name"], s.get("namespace")) == (account, NAMESPACE)
    ]


def _granted(render: Render, account: str, namespace: str | None = None) -> set[Grant]:
    grants: set[Grant] = set()
    for binding in _bindings_of(render, account):
        ref = binding["roleRef"]
        if binding["kind"] == "RoleBinding" and namespace not in (
            None,
            binding["metadata"]["namespace"],
        ):
            continue
        role_ns = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        roles = [
            r
            for r in render.of_kind(ref["kind"])
            if r["metadata"]["name"] == ref["name"] and r["metadata"].get("namespace") == role_ns
        ]
        for role in roles:
            grants |= set(_expand(role["rules"]))
    return grants


def _expand(rules: Iterable[Obj]) -> Iterator[Grant]:
    for rule in rules:
        names = rule.get("resourceNames") or [""]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in names:
                        yield Grant(group, resource, verb, name)


def test_no_rgpu_role_uses_a_wildcard(render: Render) -> None:
    wildcards = [
        f"{role['kind']}/{role['metadata']['name']}"
        for role in render.of_kind("Role") + render.of_kind("ClusterRole")
        for rule in role["rules"]
        if "*" in rule.get("verbs", []) + rule.get("resources", []) + rule.get("apiGroups", [])
    ]
    assert not wildcards


@pytest.mark.parametrize("service", API_CLIENTS)
def test_service_binds_only_roles_defined_in_the_manifests(render: Render, service: str) -> None:
    for binding in _bindings_of(render, f"rgpu-{service}"):
        ref = binding["roleRef"]
        assert render.has(ref["kind"], ref["name"]), f"rgpu-{service} binds {ref['name']}"


def test_metrics_may_only_read_renew_and_create_its_leader_lease(render: Render) -> None:
    lease = "coordination.k8s.io"
    assert _granted(render, "rgpu-metrics") == {
        Grant(lease, "leases", "get", "rgpu-metrics-leader"),
        Grant(lease, "leases", "update", "rgpu-metrics-leader"),
        Grant(lease, "leases", "create"),
    }
    assert not _granted(render, "rgpu-metrics", namespace="not-rgpu-system")
    spec = render.deployment("metrics")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True


def test_the_leader_leases_the_code_names_are_the_ones_rbac_grants() -> None:
    for service, lease in (
        ("allocator", "rgpu-allocator-leader"),
        ("metrics", "rgpu-metrics-leader"),
    ):
        text = (ROOT / "services" / service / "src" / f"rgpu_{service}" / "app.py").read_text()
        assert f'LEADER_LEASE = "{lease}"' in text, service


TOKEN_REVIEW = Grant("authentication.k8s.io", "tokenreviews", "create")


@pytest.mark.parametrize("service", [*SERVICES, "scheduler"])
def test_only_the_receivers_may_create_tokenreviews(render: Render, service: str) -> None:
    reviews = {g for g in _granted(render, f"rgpu-{service}") if g.group == TOKEN_REVIEW.group}
    assert reviews == ({TOKEN_REVIEW} if service in RECEIVERS else set())


def test_services_require_tokenreview_and_each_route_allows_exactly_its_callers_account(
    render: Render,
) -> None:
    settings = Settings.from_env(render.settings(), service="allocator")
    assert settings.auth.mode == "tokenreview"
    account = f"system:serviceaccount:{NAMESPACE}:rgpu-{{}}".format
    assert settings.auth.allocation_callers == (account("extender"),)
    assert settings.auth.probe_callers == (account("allocator"),)
    for username in (*settings.auth.allocation_callers, *settings.auth.probe_callers):
        assert render.has("ServiceAccount", username.rpartition(":")[2])


@pytest.mark.parametrize("service", SERVICES)
def test_callers_mount_a_projected_token_for_the_audience_they_call_in_the_token_dir(
    render: Render, service: str
) -> None:
    spec = render.deployment(service)["spec"]["template"]["spec"]
    projected = {
        v["name"]: source["serviceAccountToken"]
        for v in spec["volumes"]
        for source in (v.get("projected") or {}).get("sources") or ()
        if "serviceAccountToken" in source
    }
    if service not in CALLERS:
        assert projected == {}
        return
    ((volume, token),) = projected.items()
    assert token["audience"] == audience_of(CALLERS[service])
    assert token["path"] == token["audience"]
    assert 600 <= token["expirationSeconds"] <= 3600
    (mount,) = [m for m in render.container(service)["volumeMounts"] if m["name"] == volume]
    settings = Settings.from_env(_environment(render, service), service=service)
    assert settings.auth.token_dir == mount["mountPath"]
    assert mount["readOnly"] is True


def test_allocator_leases_are_granted_only_in_the_rgpu_namespace(render: Render) -> None:
    cluster_wide = _granted(render, "rgpu-allocator", namespace="not-rgpu-system")
    assert not {g for g in cluster_wide if g.resource == "leases"}
    assert render.settings()["RGPU_NAMESPACE"] == NAMESPACE


def test_discovery_leases_are_granted_only_in_the_rgpu_namespace(render: Render) -> None:
    cluster_wide = _granted(render, "rgpu-discovery", namespace="not-rgpu-system")
    assert not {g for g in cluster_wide if g.resource == "leases"}
    granted = _granted(render, "rgpu-discovery", namespace=NAMESPACE)
    verbs = {g.verb for g in granted if g.resource == "leases" and not g.name}
    assert verbs == {"get", "list", "watch", "create", "update", "delete"}


_API_METHODS: Mapping[tuple[str, str, str], tuple[str, ...]] = {
    ("", "nodes", "get"): ("read_node",),
    ("", "nodes", "list"): ("list_node",),
    ("", "namespaces", "get"): ("read_namespace",),
    ("", "configmaps", "list"): ("list_namespaced_config_map",),
    ("", "pods", "get"): ("read_namespaced_pod",),
    ("", "pods", "list"): ("list_pod_for_all_namespaces", "list_namespaced_pod"),
    ("", "pods", "patch"): ("patch_namespaced_pod",),
    ("", "pods/status", "patch"): ("patch_namespaced_pod_status",),
    ("", "pods", "update"): ("replace_namespaced_pod",),
    ("", "pods/binding", "create"): ("create_namespaced_pod_binding", "create_namespaced_binding"),
    ("", "pods/eviction", "create"): ("create_namespaced_pod_eviction",),
    ("policy", "poddisruptionbudgets", "list"): ("list_namespaced_pod_disruption_budget",),
    ("", "events", "create"): ("create_namespaced_event",),
    ("", "events", "patch"): ("patch_namespaced_event",),
    ("coordination.k8s.io", "leases", "get"): ("read_namespaced_lease",),
    ("coordination.k8s.io", "leases", "list"): ("list_namespaced_lease",),
    ("coordination.k8s.io", "leases", "create"): ("create_namespaced_lease",),
    ("coordination.k8s.io", "leases", "update"): ("replace_namespaced_lease",),
    ("coordination.k8s.io", "leases", "patch"): ("patch_namespaced_lease",),
    ("coordination.k8s.io", "leases", "delete"): ("delete_namespaced_lease",),
    ("coordination.k8s.io", "leases", "deletecollection"): ("delete_collection_namespaced_lease",),
    ("authentication.k8s.io", "tokenreviews", "create"): ("create_token_review",),
    ("", "serviceaccounts/token", "create"): ("create_namespaced_service_account_token",),
    ("networking.k8s.io", "networkpolicies", "list"): ("list_namespaced_network_policy",),
    ("networking.k8s.io", "networkpolicies", "create"): ("create_namespaced_network_policy",),
    ("networking.k8s.io", "networkpolicies", "update"): ("replace_namespaced_network_policy",),
    ("networking.k8s.io", "networkpolicies", "delete"): ("delete_namespaced_network_policy",),
}
"""Which kubernetes_asyncio methods need which (apiGroup, resource, verb). ``watch`` is the
list method passed to a watch (``KubeClient.watch(core.list_node, ...)`` or ``watch=True``)."""

_API_CLASSES = (
    CoreV1Api,
    CoordinationV1Api,
    EventsV1Api,
    AuthenticationV1Api,
    PolicyV1Api,
    NetworkingV1Api,
)
_MODE_METHODS: Mapping[tuple[str, str], frozenset[str]] = {
    ("RoleBinding", "rgpu-allocator-server-policies"): frozenset(
        {
            "list_namespaced_network_policy",
            "create_namespaced_network_policy",
            "replace_namespaced_network_policy",
            "delete_namespaced_network_policy",
        }
    ),
}
"""Calls made only in a mode a component turns on, with the binding the component brings:
without it (the component not rendered) the mode is off and the calls are never made."""
_RUNTIME_ENTRY_POINTS: Mapping[str, frozenset[str]] = {
    "caller_auth": frozenset({"create_token_review"}),
}
"""Runtime functions whose use implies API calls made deeper inside the runtime, in a class
the service never names (``caller_auth`` builds the ``CallerAuth`` whose TokenReview the
guard runs)."""
_API_NAME = re.compile(r"(read|list|create|patch|replace|delete|delete_collection)_[a-z_]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class Code:
    """What a service's Python (its modules and the runtime helpers it calls) asks of the API."""

    api_methods: frozenset[str]
    """kubernetes_asyncio API methods the code refers to (``core.list_node``)."""
    watched: frozenset[str]
    """List methods used for a watch: passed to ``.watch(...)`` (directly or through a local
    variable) or called with ``watch=True``."""


def _analyse(files: Iterable[tuple[Path, str, ast.Module]]) -> Code:
    trees = [tree for _, _, tree in files]
    nodes = [node for tree in trees for node in ast.walk(tree)]
    functions = [n for n in nodes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return Code(
        api_methods=frozenset(
            n.attr for n in nodes if isinstance(n, ast.Attribute) and _is_api_method(n.attr)
        ),
        watched=frozenset(m for f in functions for m in _watched_in(f)),
    )


def _is_api_method(name: str) -> bool:
    return _API_NAME.fullmatch(name) is not None and any(hasattr(c, name) for c in _API_CLASSES)


def _watched_in(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    aliases = {
        node.targets[0].id: node.value.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Attribute)
    }
    calls = (n for n in ast.walk(function) if isinstance(n, ast.Call))
    return {m for call in calls for m in _watched_by(call, aliases) if _is_api_method(m)}


def _watched_by(call: ast.Call, aliases: Mapping[str, str]) -> set[str]:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "watch" and call.args:
        first = call.args[0]
        if isinstance(first, ast.Attribute):
            return {first.attr}
        return {aliases[first.id]} if isinstance(first, ast.Name) and first.id in aliases else set()
    if any(k.arg == "watch" and getattr(k.value, "value", None) is True for k in call.keywords):
        return {func.attr} if isinstance(func, ast.Attribute) else set()
    return set()


@cache
def _modules(directory: Path) -> tuple[tuple[Path, str, ast.Module], ...]:
    paths = sorted(directory.rglob("*.py"))
    return tuple((p, text, ast.parse(text)) for p in paths for text in (p.read_text(),))


@cache
def _service_code(service: str) -> Code:
    own = _modules(ROOT / "services" / service / "src")
    names = {n for _, text, _ in own for n in re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", text)}
    runtime = _modules(ROOT / "libs" / "runtime" / "src")
    helpers = tuple(h for module in runtime for h in _helpers_used(module, names))
    return _analyse(own + helpers)


def _helpers_used(
    module: tuple[Path, str, ast.Module], names: set[str]
) -> Iterator[tuple[Path, str, ast.Module]]:
    """The runtime functions (as one-function modules) whose names the service mentions; a
    class the service names also brings its private methods, which the service never names."""
    path, text, tree = module
    private = {
        method
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name in names
        for method in node.body
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef)
        and method.name.startswith("_")
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.name in names or node in private
        ):
            yield path, text, ast.Module(body=[node], type_ignores=[])


def _services_ready(service: str) -> Code:
    modules = _modules(ROOT / "services" / service / "src")
    if all(path.name == "__init__.py" for path, _, _ in modules):
        pytest.fail(f"services/{service}/src has no modules yet; rerun once the service lands")
    return _with_runtime_entry_points(_service_code(service), modules)


def _with_runtime_entry_points(
    code: Code, modules: tuple[tuple[Path, str, ast.Module], ...]
) -> Code:
    identifiers = {n for _, text, _ in modules for n in re.findall(r"\b[A-Za-z_]\w*\b", text)}
    implied = {
        method
        for name, methods in _RUNTIME_ENTRY_POINTS.items()
        if name in identifiers
        for method in methods
    }
    return Code(api_methods=code.api_methods | implied, watched=code.watched)


def _needed(code: Code, grant: Grant) -> bool:
    if grant.verb == "watch":
        lists = _API_METHODS.get((grant.group, grant.resource, "list"), ())
        return bool(code.watched & set(lists))
    methods = _API_METHODS.get((grant.group, grant.resource, grant.verb), ())
    return bool(code.api_methods & set(methods))


@pytest.mark.parametrize("service", API_CLIENTS)
def test_every_rbac_rule_of_a_service_is_used_by_its_code(render: Render, service: str) -> None:
    code = _services_ready(service)
    unused = sorted(
        f"{g.group or 'core'}/{g.resource} {g.verb}"
        for g in _granted(render, f"rgpu-{service}")
        if not _needed(code, g)
    )
    assert not unused, f"rgpu-{service} is granted what its code never calls: {unused}"


@pytest.mark.parametrize("service", SERVICES)
def test_every_api_call_of_a_service_is_granted(render: Render, service: str) -> None:
    code = _services_ready(service)
    by_method = {m: key for key, methods in _API_METHODS.items() for m in methods}
    unknown = sorted(code.api_methods - set(by_method))
    assert not unknown, f"add {unknown} to _API_METHODS with the RBAC they need"
    granted = {(g.group, g.resource, g.verb) for g in _granted(render, f"rgpu-{service}")}
    off = {
        m for (kind, name), ms in _MODE_METHODS.items() if not render.has(kind, name) for m in ms
    }
    needed = {by_method[m] for m in code.api_methods - off}
    needed |= {(*by_method[m][:2], "watch") for m in code.watched - off if m in by_method}
    assert needed <= granted, f"rgpu-{service} lacks {sorted(needed - granted)}"


# ---------------------------------------------------------------------------------------------
# Network policies


def _ingress_rules(render: Render, service: str) -> list[tuple[Obj, int]]:
    labels = render.deployment(service)["spec"]["template"]["metadata"]["labels"]
    found = []
    for policy in render.of_kind("NetworkPolicy"):
        if (
            _selects(policy["spec"]["podSelector"], labels)
            and "Ingress" in policy["spec"]["policyTypes"]
        ):
            for rule in policy["spec"].get("ingress") or ():
                found += [(rule, p["port"]) for p in rule.get("ports") or ()]
    return found


def _selects(selector: Obj, labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        value, values = labels.get(expression["key"]), expression.get("values") or ()
        ok = {
            "In": value in values,
            "NotIn": value not in values,
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }[expression["operator"]]
        if not ok:
            return False
    return True


@pytest.mark.parametrize("service", SERVICES)
def test_network_policies_admit_only_ports_the_service_listens_on(
    render: Render, service: str
) -> None:
    container = render.container(service)
    ports = {p["containerPort"] for p in container["ports"]}
    opened = {port for _, port in _ingress_rules(render, service)}
    assert opened == ports


def test_only_the_scheduler_and_prometheus_reach_the_extender_port(render: Render) -> None:
    port = _port_of(render.container("extender"), "http")
    sources = [
        peer for rule, p in _ingress_rules(render, "extender") if p == port for peer in rule["from"]
    ]
    assert sources == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "rgpu-scheduler"}}},
        {"namespaceSelector": {"matchLabels": {"rgpu.io/monitoring": "enabled"}}},
    ]


def test_the_webhook_port_is_open_to_the_apiserver_whatever_its_address(overlay: Render) -> None:
    port = _port_of(overlay.container("extender"), "webhook")
    (rule,) = [rule for rule, p in _ingress_rules(overlay, "extender") if p == port]
    assert {peer["ipBlock"]["cidr"] for peer in rule["from"]} == {"0.0.0.0/0", "::/0"}


def test_the_webhook_from_apiserver_component_admits_only_its_cidrs(everything: Render) -> None:
    port = _port_of(everything.container("extender"), "webhook")
    (rule,) = [rule for rule, p in _ingress_rules(everything, "extender") if p == port]
    assert [peer["ipBlock"]["cidr"] for peer in rule["from"]] == ["192.0.2.0/24", "2001:db8::/64"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]


# ---------------------------------------------------------------------------------------------
# Server policies (k8s/components/server-policies)


def test_server_policies_are_off_unless_the_component_turns_them_on(
    overlay: Render, everything: Render
) -> None:
    assert overlay.settings()["RGPU_SERVER_POLICIES"] == "off"
    assert everything.settings()["RGPU_SERVER_POLICIES"] == "on"


def test_with_server_policies_lupine_runs_on_the_pod_network_at_its_host_port(
    everything: Render,
) -> None:
    spec = everything.get("DaemonSet", "lupine-server")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is False and spec["dnsPolicy"] == "ClusterFirst"
    (port,) = spec["containers"][0]["ports"]
    assert port["containerPort"] == port["hostPort"] == 14833


def test_the_allocator_finds_the_lupine_pods_where_the_daemonset_puts_them(
    everything: Render,
) -> None:
    daemonset = everything.get("DaemonSet", "lupine-server")
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    mode = AllocatorSettings.from_env(everything.settings()).server_policies
    assert mode.enabled
    assert mode.lupine_namespace == daemonset["metadata"]["namespace"]
    assert all(labels.get(key) == value for key, value in mode.lupine_labels)


def test_the_standing_policy_admits_only_discoverys_pods_to_every_lupine_pod(
    everything: Render,
) -> None:
    policy = everything.get("NetworkPolicy", "rgpu-lupine-probes-only")
    daemonset = everything.get("DaemonSet", "lupine-server")
    assert _selects(
        policy["spec"]["podSelector"], daemonset["spec"]["template"]["metadata"]["labels"]
    )
    ((peer,),) = [rule["from"] for rule in policy["spec"]["ingress"]]
    discovery = everything.deployment("discovery")["spec"]["template"]["metadata"]["labels"]
    assert _selects(peer["podSelector"], discovery)
    assert _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": NAMESPACE})
    assert peer["podSelector"]["matchLabels"] == DISCOVERY_LABELS
    # The simulated cluster installs the very same policy (rgpu up --sim --server-policies).
    rendered = {k: v for k, v in policy.items() if k != "metadata"}
    assert rendered == {k: v for k, v in STANDING_POLICY.items() if k != "metadata"}
    assert policy["metadata"]["name"] == STANDING_POLICY["metadata"]["name"]


def test_the_allocators_policy_grant_is_networkpolicies_in_the_lupine_namespace_only(
    everything: Render,
) -> None:
    role = everything.get("Role", "rgpu-allocator-server-policies")
    assert role["metadata"]["namespace"] == "rgpu-lupine"
    assert set(_expand(role["rules"])) == {
        Grant("networking.k8s.io", "networkpolicies", verb, "")
        for verb in ("list", "watch", "create", "update", "delete")
    }
    binding = everything.get("RoleBinding", "rgpu-allocator-server-policies")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rgpu-allocator", "namespace": NAMESPACE}
    ]


def test_every_pod_may_resolve_dns_and_api_clients_may_reach_the_apiserver(
    render: Render,
) -> None:
    for service in (*SERVICES, "scheduler"):
        labels = render.deployment(service)["spec"]["template"]["metadata"]["labels"]
        egress = [
            port
            for policy in render.of_kind("NetworkPolicy")
            if _selects(policy["spec"]["podSelector"], labels)
            for rule in policy["spec"].get("egress") or ()
            for port in rule.get("ports") or ()
        ]
        assert {"protocol": "UDP", "port": 53} in egress, service
        assert {"protocol": "TCP", "port": 443} in egress, service


# ---------------------------------------------------------------------------------------------
# Overlays


def test_dev_runs_one_replica_of_everything(dev: Render) -> None:
    assert {d["metadata"]["name"]: d["spec"]["replicas"] for d in dev.of_kind("Deployment")} == {
        f"rgpu-{s}": 1 for s in (*SERVICES, "scheduler")
    }


SINGLE_REPLICA = {"rgpu-otel-collector", "rgpu-tempo"}
"""Off the scheduling path and single by nature: tail sampling needs every span of a trace in
one collector, and Tempo's local storage has one writer."""


def test_production_runs_two_or_more_replicas_of_every_deployment(production: Render) -> None:
    autoscaled = {
        h["spec"]["scaleTargetRef"]["name"]: h["spec"]["minReplicas"]
        for h in production.of_kind("HorizontalPodAutoscaler")
    }
    for deployment in production.of_kind("Deployment"):
        name = deployment["metadata"]["name"]
        replicas = autoscaled.get(name, deployment["spec"].get("replicas", 1))
        if name in SINGLE_REPLICA:
            assert replicas == 1, name
            continue
        assert replicas >= 2, name
        assert name not in autoscaled or "replicas" not in deployment["spec"], name


def test_production_autoscales_on_cpu_only_the_services_whose_replicas_divide_the_load(
    production: Render,
) -> None:
    hpas = production.of_kind("HorizontalPodAutoscaler")
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas} == {
        "rgpu-allocator",
        "rgpu-extender",
    }
    assert all(h["apiVersion"] == "autoscaling/v2" for h in hpas)
    for hpa in hpas:
        assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]


def test_production_sizes_discovery_and_metrics_by_hand_with_two_for_failover(
    production: Render,
) -> None:
    for service in ("discovery", "metrics"):
        assert production.deployment(service)["spec"]["replicas"] == 2, service


def test_production_budgets_disruptions_of_every_deployment(production: Render) -> None:
    budgets = production.of_kind("PodDisruptionBudget")
    for deployment in production.of_kind("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        matching = [b for b in budgets if _selects(b["spec"]["selector"], labels)]
        assert len(matching) == 1, deployment["metadata"]["name"]


def test_production_spreads_replicas_over_nodes_and_zones(production: Render) -> None:
    for deployment in production.of_kind("Deployment"):
        spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        keys = {c["topologyKey"]: c for c in spread}
        assert set(keys) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
        for constraint in spread:
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert _selects(constraint["labelSelector"], labels)
            assert "app.kubernetes.io/name" in constraint["matchLabelKeys"]


def test_allocator_decides_on_every_replica_and_elects_one_for_background_work(
    production: Render,
) -> None:
    assert production.get("HorizontalPodAutoscaler", "rgpu-allocator")["spec"]["minReplicas"] >= 2
    granted = {
        (g.verb, g.name) for g in _granted(production, "rgpu-allocator") if g.resource == "leases"
    }
    # Claims and the leader Lease alike: every name in rgpu-system, created and replaced (CAS).
    assert {("get", ""), ("create", ""), ("update", "")} <= granted


@pytest.mark.parametrize("name", OVERLAYS)
def test_overlay_tags_each_service_image_on_its_own(name: str) -> None:
    kustomization = yaml.safe_load((K8S / "overlays" / name / "kustomization.yaml").read_text())
    images = [i["name"] for i in kustomization["images"]]
    assert sorted(images) == sorted(f"ghcr.io/rgpu/rgpu-{s}" for s in SERVICES)


# ---------------------------------------------------------------------------------------------
# Components


def test_observability_points_every_service_at_the_collector(production: Render) -> None:
    endpoint = production.settings()["OTEL_EXPORTER_OTLP_ENDPOINT"]
    parts = urlsplit(endpoint)
    assert parts.hostname == f"rgpu-otel-collector.{NAMESPACE}.svc"
    port = _service_port(production, "rgpu-otel-collector", parts.port)
    (collector,) = production.get("Deployment", "rgpu-otel-collector")["spec"]["template"]["spec"][
        "containers"
    ]
    assert _container_port(collector, port["targetPort"]) == _port_of(collector, "otlp-http")


def test_service_monitor_scrapes_the_http_port_of_every_service(production: Render) -> None:
    monitor = production.get("ServiceMonitor", "rgpu")
    selected = [
        s["metadata"]["name"]
        for s in production.of_kind("Service")
        if _selects(monitor["spec"]["selector"], s["metadata"]["labels"])
    ]
    assert sorted(selected) == sorted(f"rgpu-{s}" for s in SERVICES)
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]
    for name in selected:
        assert "http" in {p["name"] for p in production.get("Service", name)["spec"]["ports"]}


def test_production_carries_the_alert_rules_beside_the_service_monitor(
    production: Render,
) -> None:
    (rule,) = production.of_kind("PrometheusRule")
    monitor = production.get("ServiceMonitor", "rgpu")
    source = yaml.safe_load((K8S / "components/observability/prometheusrule.yaml").read_text())
    assert rule["metadata"]["namespace"] == monitor["metadata"]["namespace"] == NAMESPACE
    # One label for the Prometheus' serviceMonitorSelector and ruleSelector to match alike.
    assert rule["metadata"]["labels"] == monitor["metadata"]["labels"]
    assert rule["spec"] == source["spec"]


def _dashboard(render: Render) -> Obj:
    (board,) = [
        o
        for o in render.of_kind("ConfigMap")
        if o["metadata"].get("labels", {}).get("grafana_dashboard")
    ]
    loaded: Obj = json.loads(board["data"]["rgpu.json"])
    return loaded


def _queries(dashboard: Obj) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]


def test_dashboard_shows_pool_use_holders_latency_and_refusals(production: Render) -> None:
    text = "\n".join(_queries(_dashboard(production)))
    for metric in (
        "hami_remote_gpu_allocated",
        "hami_remote_gpu_overview",
        "rgpu_card_state",
        "rgpu_card_holder_info",
        "rgpu_http_request_duration_seconds_bucket",
    ):
        assert metric in text, metric
    assert re.search(r'route=~"[^"]*/filter', text)
    assert re.search(r'route=~"[^"]*/bind', text)
    assert "by (reason)" in text


def test_dashboard_queries_only_metrics_the_code_exports(production: Render) -> None:
    sources = "\n".join(
        text
        for directory in (
            *(ROOT / "services" / s / "src" for s in SERVICES),
            ROOT / "libs" / "runtime" / "src",
        )
        for _, text, _ in _modules(directory)
    )
    names = {
        m
        for expr in _queries(_dashboard(production))
        for m in re.findall(r"\b((?:hami|rgpu)_[a-z_]+)\b", expr)
    }
    missing = sorted(n for n in names if not re.search(rf"\b{_family(n)}\b", sources))
    assert not missing, f"the dashboard queries metrics no code exports: {missing}"


def _family(sample: str) -> str:
    return re.sub(r"_(bucket|count|sum|total)$", "", sample)


def test_lupine_server_listens_probes_and_advertises_one_port(everything: Render) -> None:
    daemonset = everything.get("DaemonSet", "lupine-server")
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    port = _port_of(container, "lupine")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LUPINE_PORT"] == str(port)
    assert next(p["hostPort"] for p in container["ports"] if p["name"] == "lupine") == port
    for probe in ("livenessProbe", "readinessProbe"):
        assert _container_port(container, container[probe]["tcpSocket"]["port"]) == port
    # The component alone runs lupine on the host network; server-policies (also rendered
    # here) takes it off, which its own test checks.
    shipped = yaml.safe_load((K8S / "components" / "lupine-server" / "daemonset.yaml").read_text())
    assert shipped["spec"]["template"]["spec"]["hostNetwork"] is True


def test_lupine_server_runs_only_on_labelled_server_nodes(everything: Render) -> None:
    spec = everything.get("DaemonSet", "lupine-server")["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "hami.io/lupine-server", "operator": "Exists"}]}
    ]


def test_lupine_namespace_is_left_out_of_the_webhook(everything: Render) -> None:
    labels = everything.get("Namespace", "rgpu-lupine")["metadata"]["labels"]
    assert labels["rgpu.io/webhook"] == "ignore"


# ---------------------------------------------------------------------------------------------
# Docker image


def _stages() -> list[list[str]]:
    """Dockerfile instructions (continuations joined) grouped by FROM stage."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    stages: list[list[str]] = [[]]
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages[1:]


def test_dockerfile_installs_one_service_chosen_by_build_arg() -> None:
    build = " ".join(_stages()[0])
    assert "ARG SERVICE" in build
    syncs = [m for line in _stages()[0] for m in re.findall(r"uv sync (.+)", line)]
    assert len(syncs) == 2
    for sync in syncs:
        for flag in ("--frozen", "--no-dev", '--package "rgpu-${SERVICE}"'):
            assert flag in sync, f"{flag} missing from `uv sync {sync}`"
    assert "--no-editable" in syncs[-1]
    assert "COPY services/${SERVICE}/ services/${SERVICE}/" in build


def test_dockerfile_pins_the_uv_the_makefile_uses() -> None:
    make = re.search(r"UV_VERSION\s*:=\s*(\S+)", (ROOT / "Makefile").read_text())
    assert make
    assert f"uv=={make[1]}" in " ".join(_stages()[0])


def test_dockerfile_final_stage_runs_the_service_module_as_the_manifests_uid(
    render: Render,
) -> None:
    final = _stages()[-1]
    users = [line.split()[1] for line in final if line.upper().startswith("USER ")]
    assert users
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    for service in SERVICES:
        pod = render.deployment(service)["spec"]["template"]["spec"]["securityContext"]
        assert pod["runAsUser"] == int(uid)
    text = " ".join(final)
    assert "SERVICE_MODULE=rgpu_${SERVICE}" in text
    cmd = json.loads(next(line[4:] for line in final if line.startswith("CMD ")))
    assert cmd[-1].startswith("exec python -m") and "$SERVICE_MODULE" in cmd[-1]
    assert not any("uv sync" in line or "pip install" in line for line in final)


def test_dockerignore_admits_only_sources_pyprojects_and_the_lock() -> None:
    lines = [
        line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")
    ]
    assert lines[0] == "**"
    admitted = [line[1:] for line in lines if line.startswith("!")]
    assert all(
        a in ("pyproject.toml", "uv.lock")
        or re.fullmatch(r"(libs|services)/\*/(pyproject\.toml|src/\*\*)", a)
        for a in admitted
    ), admitted


@pytest.mark.parametrize("service", SERVICES)
def test_service_image_dependencies_exclude_dev_tools_and_other_services(service: str) -> None:
    command = ["export", "--frozen", "--no-dev", "--no-hashes", "--package", f"rgpu-{service}"]
    result = subprocess.run(
        [_uv(), *command], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    names = {
        _requirement_name(line)
        for line in result.stdout.splitlines()
        if line and not line.startswith(("#", " "))
    }
    assert service in names
    forbidden = {*DEV_TOOLS, "kubesim", *(s for s in SERVICES if s != service)}
    assert not names & forbidden, sorted(names & forbidden)


def _requirement_name(line: str) -> str:
    """``pytest==8.3 ; ...`` gives ``pytest``; a member ``-e ./libs/kubesim`` gives ``kubesim``."""
    if line.startswith("-e "):
        return line.rstrip("/").rsplit("/", 1)[-1]
    return re.split(r"[=<>;\s\[]", line, maxsplit=1)[0].lower()


def _uv() -> str:
    # `uv run` exports its own path as UV; the venv's python has no uv module.
    found = os.environ.get("UV") or shutil.which("uv")
    if not found:
        pytest.fail("uv not found: run the tests with `python3 -m uv run` (make test does)")
    return found


def test_the_simulated_stack_sends_pods_to_the_webhook_exactly_as_k8s_does() -> None:
    webhook = yaml.safe_load((ROOT / "k8s" / "base" / "extender" / "webhook.yaml").read_text())
    (condition, skip) = webhook["webhooks"][0]["matchConditions"]
    assert (condition["name"], condition["expression"]) == (MATCH_CONDITION_NAME, MATCH_CONDITION)
    assert (skip["name"], skip["expression"]) == (SKIP_CONDITION_NAME, SKIP_CONDITION)
    (condition,) = webhook["webhooks"][1]["matchConditions"]
    assert (condition["name"], condition["expression"]) == (
        SUBRESOURCE_MATCH_CONDITION_NAME,
        SUBRESOURCE_MATCH_CONDITION,
    )


# ---------------------------------------------------------------------------------------------
# Getting started with the overlays: the dev certificate and the images


def test_the_dev_overlay_without_its_certificate_fails_naming_the_command(tmp_path: Path) -> None:
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns(DEV_CERTS))
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is not on PATH: run `make setup`"
    result = subprocess.run(
        [kubectl, "kustomize", str(tree / "overlays" / "dev")], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "generated-by-make-dev-certs" in result.stderr  # read: run `make dev-certs`
    make = (ROOT / "Makefile").read_text()
    assert f"--out k8s/overlays/dev/{DEV_CERTS}" in make


def test_make_images_builds_and_pushes_one_tagged_image_per_service(tmp_path: Path) -> None:
    """No Docker engine here: a stand-in `docker` records what make asks of it."""
    log = tmp_path / "docker.log"
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    args = ["make", "-s", "push-images", "REGISTRY=registry.example.com/ml", "TAG=0.2.0"]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    services = ("discovery", "allocator", "extender", "metrics")
    assert calls == [
        *(
            f"build -f docker/Dockerfile --build-arg SERVICE={s} "
            f"-t registry.example.com/ml/rgpu-{s}:0.2.0 ."
            for s in services
        ),
        *(f"push registry.example.com/ml/rgpu-{s}:0.2.0" for s in services),
    ]
