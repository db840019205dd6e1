"""One definition of "the whole system on the embedded cluster", used by
``rgpu demo``, ``rgpu up --sim`` and the end-to-end tests, so what the demo proves is what the
tests prove. The simulated apiserver, the fake lupine servers and the scheduler and kubelet
emulators run in this process; the four services run as separate processes over real HTTP,
and pods reach the extender's webhook over TLS through the apiserver's admission chain.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import trustme

from rgpu_kubesim import ApiOptions, PodNetwork, SimApiServer, Store, run_apiserver
from rgpu_kubesim.fleet import FleetSpec, SeededFleet, plan_fleet, seed_fleet
from rgpu_kubesim.kubelet import KubeletConfig, KubeletEmulator
from rgpu_kubesim.scheduler import SchedulerConfig, SchedulerEmulator

from .processes import (
    READY_TIMEOUT_SECONDS,
    ProcessGroup,
    ServiceProcess,
    wait_ready,
)
from .service_proxy import ServiceProxy
from .span_receiver import receiving
from .stack_layout import REPLICATED, SERVICES, Layout, endpoints_of, scheme
from .stack_network import SERVER_POLICIES_ENV, enforce, fence_servers
from .stack_rbac import SYSTEM_NAMESPACE as SYSTEM_NAMESPACE
from .stack_rbac import apply_rbac, user_grant

__all__ = [
    "REPLICATED",
    "SERVICES",
    "Stack",
    "StackOptions",
    "run_stack",
    "service_account",
]


def service_account(service: str) -> str:
    """The user a service acts as, named like the service accounts k8s/base deploys."""
    return f"system:serviceaccount:{SYSTEM_NAMESPACE}:rgpu-{service}"


# The webhook trusts exactly the services that write scheduler-owned annotations, as k8s/base.
TRUSTED_USERS = ",".join(service_account(s) for s in ("allocator", "extender"))
# Who may call each guarded route, as k8s/base/settings.env: only the extender books, commits
# and releases; only the allocator asks discovery for a probe. Each service gets its tokens
# (one per audience it calls) through TokenRequest, having no kubelet to project them.
ALLOCATION_CALLERS = service_account("extender")
PROBE_CALLERS = service_account("allocator")


@dataclass(frozen=True, slots=True, kw_only=True)
class StackOptions:
    """What to run; the defaults are ``make demo``'s."""

    servers: int = 6
    cards: int = 4
    clients: int = 12
    seed: int = 1
    granularity: str = "server"
    booking_ttl_seconds: float = 30.0
    probe_interval_seconds: float = 1.0
    """Fast probes so busy cards show up within a second in the demo."""
    kubelet: KubeletConfig = field(default_factory=KubeletConfig)
    unschedulable_flush_seconds: float = 300.0
    max_backoff_seconds: float = 2.0
    """kube-scheduler's ``podMaxBackoffSeconds``; k8s/base deploys 2 so wake-ups are fast."""
    trace_scheduler: bool = False
    """Keep every pod's queue history in the scheduler emulator (``rgpu soak --trace``)."""
    replicas: int = 1
    """Processes per replicated service; above 1 each service is reached through a
    ``ServiceProxy`` and the scheduler emulator spreads its calls over the extenders."""
    h2only_share: float = 0.0
    """Servers running an old lupine build that answers only HTTP/2."""
    per_gpu: bool = False
    """Every server Node runs one lupine per GPU (``rgpu.io/lupine-instances``): each card is
    a server of its own, isolated at card size."""
    work_dir: Path | None = None
    apiserver_port: int = 0
    ports: Mapping[str, int] = field(default_factory=dict)
    """Fixed ports where clients reach a service (``discovery``, ``allocator``, ``extender``,
    ``metrics``, ``webhook``): its process, or its Service with replicas. Others are picked."""
    extra_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Per-service extra environment (``{"extender": {"OTEL_...": ...}}``)."""
    prepare: Callable[[Store], None] | None = None
    """Writes objects straight into the store before the services start, as a cluster has
    them before rgpu is installed (the system benchmark's background pods)."""
    spans_file: Path | None = None
    """Keep the services' spans in this JSON-lines file (an embedded OTLP receiver) for
    ``rgpu trace``; ``None`` keeps none (the soak and the tests measure without them)."""
    otlp_endpoint: str | None = None
    """Send the services' spans to this OTLP/HTTP base URL (a collector or trace store)
    instead; it wins over ``spans_file``."""
    server_policies: bool = False
    """Run the server-policies mode on a cluster that enforces NetworkPolicy: lupine as pods,
    the standing policy, ``RGPU_SERVER_POLICIES=on`` and the simulated network in front of
    every fake lupine server (``rgpu_sim.stack_network``)."""


def loop_options() -> dict[str, bool]:
    """``anyio.run``'s backend options for a process that hosts the simulated cluster: uvloop
    where it is installed (with uvicorn's standard extras on Linux), which cuts the simulation's
    CPU per pod; plain asyncio elsewhere."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


@dataclass(slots=True, kw_only=True)
class Stack:
    """A running system: handles to every part, for driving and for checking."""

    options: StackOptions
    sim: SimApiServer
    fleet: SeededFleet
    services: dict[str, ServiceProcess]
    """Every process by name: the service's name, or ``<service>-<n>`` for replicas."""
    proxies: dict[str, ServiceProxy]
    """The Service in front of each replicated service (empty with one replica)."""
    scheduler: SchedulerEmulator
    kubelet: KubeletEmulator
    work_dir: Path
    webhook_url: str
    apiserver: httpx.AsyncClient
    scheduler_tls: ssl.SSLContext
    """kube-scheduler's side of the scheduler listener: trusts the stack's CA and presents the
    client certificate the extender requires (``httpx.AsyncClient(verify=stack.scheduler_tls)``
    to call ``url("extender")``)."""
    ca_file: Path
    """The CA of the extender's serving certificate (the webhook's ``caBundle``)."""
    network: PodNetwork | None = None
    """The simulated network enforcing NetworkPolicy (``StackOptions.server_policies``)."""

    def url(self, service: str) -> str:
        """Where clients reach ``service``: its Service with replicas, else its process."""
        proxy = self.proxies.get(service)
        return proxy.url if proxy else self.services[service].url

    async def kill(self, name: str, *, hard: bool = True) -> None:
        """Stop process ``name`` (SIGKILL when ``hard``); its Service stops routing to it."""
        process = self.services[name]
        for proxy, port in self._endpoints(process):
            proxy.ready.discard(port)
        if hard:
            await process.kill()
        else:
            await process.stop()

    async def start(self, name: str) -> None:
        """Start process ``name`` again and wait until ready, then route to it again."""
        process = self.services[name]
        process.start()
        await wait_ready(process)
        for proxy, port in self._endpoints(process):
            proxy.ready.add(port)

    def _endpoints(self, process: ServiceProcess) -> list[tuple[ServiceProxy, int]]:
        return endpoints_of(self.proxies, process)

    async def restart(self, name: str, *, hard: bool = True) -> None:
        """Kill (SIGKILL when ``hard``) and start process ``name`` again, waiting until ready."""
        await self.kill(name, hard=hard)
        await self.start(name)

    async def create_pod(self, manifest: dict[str, Any], *, user: str = "alice") -> httpx.Response:
        """Create a pod through the apiserver (and so through the admission webhook)."""
        namespace = manifest["metadata"].get("namespace", "default")
        return await self.apiserver.post(
            f"/api/v1/namespaces/{namespace}/pods", json=manifest, headers={"X-Sim-User": user}
        )


SKIP_CONDITION_NAME = "not-the-allocators-own-updates"
SKIP_CONDITION = (
    "request.operation == 'CREATE'"
    " || request.userInfo.username != 'system:serviceaccount:rgpu-system:rgpu-allocator'"
)
"""The webhook's second matchCondition, word for word as k8s/base/extender/webhook.yaml
folds it: the allocator's own pod updates (lifting its scheduling gate with the booking,
nudges) skip the webhook, which would allow them anyway (the allocator is trusted)."""

MATCH_CONDITION_NAME = "asks-for-remote-gpu-names-lupine-or-carries-owned-annotations"
MATCH_CONDITION = (
    "(object.spec.containers"
    " + (has(object.spec.initContainers) ? object.spec.initContainers : []))"
    " .exists(c, has(c.resources)"
    " && [has(c.resources.limits) ? c.resources.limits : {},"
    " has(c.resources.requests) ? c.resources.requests : {}]"
    " .exists(r, 'nvidia.com/remote-gpu' in r || 'nvidia.com/remote-gpu-memory' in r"
    " || r.exists(k, k.matches('(?i)remote') && k.matches('(?i)gpu')))"
    " || has(c.env) && c.env.exists(e, e.name.startsWith('LUPINE_'))"
    " || has(c.envFrom) && c.envFrom.exists(f, has(f.prefix) && f.prefix.startsWith('LUPINE_')))"
    " || [object, oldObject].exists(o, o != null && has(o.metadata.annotations)"
    " && o.metadata.annotations.exists(k, k.startsWith('hami.io/remote-gpu-devices-')"
    " || k == 'hami.io/lupine-endpoint' || k.startsWith('rgpu.io/')))"
)
"""The webhook's matchCondition, word for word as k8s/base/extender/webhook.yaml folds it
(tests/test_manifests.py holds the two equal), so the simulated cluster admits as deployed."""
SUBRESOURCE_MATCH_CONDITION_NAME = "changes-owned-annotations-or-names-lupine"
SUBRESOURCE_MATCH_CONDITION = (
    "[[object, oldObject], [oldObject, object]].exists(p,"
    " has(p[0].metadata.annotations) && p[0].metadata.annotations.exists(k,"
    " (k.startsWith('hami.io/remote-gpu-devices-') || k == 'hami.io/lupine-endpoint'"
    " || k.startsWith('rgpu.io/'))"
    " && !(has(p[1].metadata.annotations) && k in p[1].metadata.annotations"
    " && p[1].metadata.annotations[k] == p[0].metadata.annotations[k])))"
    " || has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c,"
    " has(c.env) && c.env.exists(e, e.name.startsWith('LUPINE_'))"
    " || has(c.envFrom) && c.envFrom.exists(f, has(f.prefix) && f.prefix.startsWith('LUPINE_')))"
)
"""The subresource webhook's matchCondition (pods/status, pods/ephemeralcontainers), likewise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Certs:
    """One CA signs the extender's serving certificate and kube-scheduler's client certificate,
    as the dev overlay's and the cert-manager component's do."""

    cert: Path
    key: Path
    ca: Path
    scheduler_cert: Path
    scheduler_key: Path

    def scheduler_tls(self) -> ssl.SSLContext:
        """What kube-scheduler's extender ``tlsConfig`` amounts to: trust the CA, present the
        client certificate."""
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.scheduler_cert), str(self.scheduler_key))
        return context


def _write_certs(work_dir: Path) -> _Certs:
    ca = trustme.CA()
    serving = ca.issue_cert("127.0.0.1", "localhost", "rgpu-extender.rgpu-system.svc")
    # Its subject is what identifies it; the name only has to be a valid one.
    scheduler = ca.issue_cert(
        "rgpu-scheduler.rgpu-system.svc",
        common_name=f"system:serviceaccount:{SYSTEM_NAMESPACE}:rgpu-scheduler",
    )
    certs = _Certs(
        cert=work_dir / "tls.crt",
        key=work_dir / "tls.key",
        ca=work_dir / "ca.crt",
        scheduler_cert=work_dir / "scheduler-client.crt",
        scheduler_key=work_dir / "scheduler-client.key",
    )
    serving.cert_chain_pems[0].write_to_path(str(certs.cert))
    serving.private_key_pem.write_to_path(str(certs.key))
    ca.cert_pem.write_to_path(str(certs.ca))
    scheduler.cert_chain_pems[0].write_to_path(str(certs.scheduler_cert))
    scheduler.private_key_pem.write_to_path(str(certs.scheduler_key))
    return certs


def _webhook_configuration(url: str, ca_pem: bytes) -> dict[str, Any]:
    client = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    # As k8s/base deploys it: only kube-system is exempt, and the apiserver sends a pod only
    # when it asks for the resource, names a lupine variable or carries an owned annotation
    # (kubesim evaluates the CEL for real).
    namespaces = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
        ]
    }
    common = {
        "clientConfig": client,
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
        "namespaceSelector": namespaces,
    }
    pods = {
        "name": "pods.rgpu.io",
        "rules": [
            {
                "operations": ["CREATE", "UPDATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
            }
        ],
        "reinvocationPolicy": "IfNeeded",
        "matchConditions": [
            {"name": MATCH_CONDITION_NAME, "expression": MATCH_CONDITION},
            {"name": SKIP_CONDITION_NAME, "expression": SKIP_CONDITION},
        ],
    }
    subresources = {
        "name": "pods-subresources.rgpu.io",
        "rules": [
            {
                "operations": ["UPDATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods/status", "pods/ephemeralcontainers"],
            }
        ],
        "reinvocationPolicy": "Never",
        "matchConditions": [
            {
                "name": SUBRESOURCE_MATCH_CONDITION_NAME,
                "expression": SUBRESOURCE_MATCH_CONDITION,
            }
        ],
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "rgpu-webhook"},
        "webhooks": [common | pods, common | subresources],
    }


def _service_env(options: StackOptions, sim_url: str, urls: Mapping[str, str]) -> dict[str, str]:
    return {
        "RGPU_KUBE_URL": sim_url,
        "RGPU_DISCOVERY_URL": urls["discovery"],
        "RGPU_ALLOCATOR_URL": urls["allocator"],
        "RGPU_GRANULARITY": options.granularity,
        "RGPU_BOOKING_TTL_SECONDS": f"{options.booking_ttl_seconds:g}",
        "RGPU_PROBE_INTERVAL_SECONDS": f"{options.probe_interval_seconds:g}",
        "RGPU_PROBE_TIMEOUT_SECONDS": "1",
        "RGPU_TRUSTED_USERS": TRUSTED_USERS,
        "RGPU_AUTH": "tokenreview",
        "RGPU_ALLOCATION_CALLERS": ALLOCATION_CALLERS,
        "RGPU_PROBE_CALLERS": PROBE_CALLERS,
        "RGPU_LOG_FORMAT": "json",
        "RGPU_NAMESPACE": SYSTEM_NAMESPACE,
        **(SERVER_POLICIES_ENV if options.server_policies else {}),
    }


SPAN_DELAY_MS = "500"
"""How often the services send their spans (the SDK's default is 5 s): ``rgpu trace`` right
after a pod binds should find its story."""


def _traces_env(endpoint: str | None) -> dict[str, str]:
    if endpoint is None:
        return {}
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": SPAN_DELAY_MS,
    }


def _processes(
    options: StackOptions,
    sim_url: str,
    work_dir: Path,
    certs: _Certs,
    layout: Layout,
    traces: str | None = None,
) -> dict[str, ServiceProcess]:
    common = _service_env(options, sim_url, {s: layout.url(s) for s in SERVICES})
    common |= _traces_env(traces)
    group = ProcessGroup()
    processes = {}
    for service, names in layout.names.items():
        for name in names:
            env = {
                **common,
                "RGPU_LISTEN": f"127.0.0.1:{layout.ports[name]}",
                "RGPU_TOKEN_ACCOUNT": f"rgpu-{service}",
                **options.extra_env.get(service, {}),
            }
            health = None
            if service == "extender":
                # As the dev overlay deploys it: the scheduler listener serves TLS and answers
                # only kube-scheduler's client certificate; the kubelet probes the webhook's.
                webhook = f"127.0.0.1:{layout.webhook_ports[name]}"
                env |= {
                    "RGPU_WEBHOOK_LISTEN": webhook,
                    "RGPU_TLS_CERT_FILE": str(certs.cert),
                    "RGPU_TLS_KEY_FILE": str(certs.key),
                    "RGPU_SCHEDULER_CLIENT_CA_FILE": str(certs.ca),
                }
                health = f"https://{webhook}"
            # Replicas log to a directory each: the log file is named after the service.
            log_dir = work_dir if name == service else work_dir / name
            log_dir.mkdir(parents=True, exist_ok=True)
            processes[name] = ServiceProcess(
                service=service,
                env=env,
                log_dir=log_dir,
                url=f"{scheme(service)}://127.0.0.1:{layout.ports[name]}",
                health_url=health,
                verify=ssl.create_default_context(cafile=str(certs.ca)),
                group=group,
            )
    return processes


def _quiet(step: str) -> None:
    pass


@asynccontextmanager
async def run_stack(
    options: StackOptions = StackOptions(), *, progress: Callable[[str], None] = _quiet
) -> AsyncIterator[Stack]:
    """Run the whole system until the block exits; every process is stopped on the way out.

    ``progress`` is told each step of the start before it begins (a start takes 10 s to a
    minute on a busy machine, and a command that shows nothing meanwhile looks hung).
    """
    async with AsyncExitStack() as stack:
        work_dir = options.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work_dir.mkdir(parents=True, exist_ok=True)
        # Each service's kube client announces itself as rgpu-<service>; the simulated
        # apiserver maps that to its service account, as token authentication would.
        agents = {f"rgpu-{s}": service_account(s) for s in SERVICES}
        api_options = ApiOptions(seed=options.seed, user_agents=agents, user_grant=user_grant())
        progress("starting the simulated apiserver")
        sim = await stack.enter_async_context(
            run_apiserver(port=options.apiserver_port, options=api_options)
        )
        sim.store.create("namespaces", {"metadata": {"name": SYSTEM_NAMESPACE}})
        apply_rbac(sim.store)
        plan = plan_fleet(
            FleetSpec(
                servers=options.servers,
                cards=options.cards,
                clients=options.clients,
                seed=options.seed,
                h2only_share=options.h2only_share,
                per_gpu=options.per_gpu,
            )
        )
        progress(f"seeding {options.servers} lupine servers and {options.clients} client nodes")
        fleet = await stack.enter_async_context(seed_fleet(sim.store, plan))
        if options.server_policies:
            fence_servers(sim, fleet, SYSTEM_NAMESPACE)
            apply_rbac(sim.store, part="components/server-policies")
        if options.prepare is not None:
            options.prepare(sim.store)
        certs = _write_certs(work_dir)
        layout = Layout.plan(options.replicas, options.ports)
        traces = options.otlp_endpoint
        if traces is None and options.spans_file is not None:
            traces = await stack.enter_async_context(receiving(options.spans_file))
        services = _processes(options, sim.url, work_dir, certs, layout, traces)
        webhook_url = layout.webhook_url()
        stack.push_async_callback(next(iter(services.values())).group.stop)
        progress(f"starting {len(services)} service processes")
        for process in services.values():
            process.start()
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        for proxy in layout.proxies.values():
            await tg.start(proxy.serve)
        # Every process imports at once: on a busy 2-core machine the last can take minutes.
        ready_timeout = max(READY_TIMEOUT_SECONDS, 30.0 * len(services))
        for name, process in services.items():
            progress(f"waiting for {name} to be ready")
            await wait_ready(process, ready_timeout)
            for proxy, port in endpoints_of(layout.proxies, process):
                proxy.ready.add(port)
        sim.store.create(
            "mutatingwebhookconfigurations",
            _webhook_configuration(webhook_url, certs.ca.read_bytes()),
        )
        apiserver = await stack.enter_async_context(httpx.AsyncClient(base_url=sim.url, timeout=10))
        emulated = httpx.AsyncClient(base_url=sim.url, timeout=10)
        await stack.enter_async_context(emulated)
        # One client per replica, each through the Service: every client's kept-alive
        # connection lands on its own replica, calls alternate between clients, and a killed
        # replica's client reconnects to a ready one — a Service balancing per request.
        extenders = (layout.url("extender"),) * len(layout.names["extender"])
        scheduler = SchedulerEmulator(
            SchedulerConfig(
                extender_url=extenders[0],
                more_extender_urls=extenders[1:],
                unschedulable_flush_seconds=options.unschedulable_flush_seconds,
                max_backoff_seconds=options.max_backoff_seconds,
                seed=options.seed,
                trace=options.trace_scheduler,
                extender_tls=certs.scheduler_tls(),
            ),
            emulated,
        )
        kubelet = KubeletEmulator(options.kubelet, emulated, fleet.lupine.get)
        progress("starting the scheduler and kubelet emulators")
        # The emulators use the clients above: they stop before the clients close (the exit
        # stack unwinds last in, first out), or a pod starting at the very end sends on a
        # closed client.
        stack.callback(tg.cancel_scope.cancel)
        await tg.start(scheduler.run)
        await tg.start(kubelet.run)
        network = await enforce(tg, sim, fleet) if options.server_policies else None
        yield Stack(
            options=options,
            sim=sim,
            fleet=fleet,
            services=services,
            proxies=layout.proxies,
            scheduler=scheduler,
            kubelet=kubelet,
            work_dir=work_dir,
            webhook_url=webhook_url,
            apiserver=apiserver,
            scheduler_tls=certs.scheduler_tls(),
            ca_file=certs.ca,
            network=network,
        )
