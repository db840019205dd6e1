"""One definition of "the whole system on the embedded cluster", used by
``rgpu demo``, ``rgpu up --sim`` and the end-to-end tests, so what the demo proves is what the
tests prove. The simulated apiserver, the fake lupine servers and the scheduler and kubelet
emulators run in this process; the four services run as separate processes over real HTTP,
and pods reach the extender's webhook over TLS through the apiserver's admission chain.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import trustme

from rgpu_kubesim import ApiOptions, SimApiServer, Store, run_apiserver
from rgpu_kubesim.fleet import FleetSpec, SeededFleet, plan_fleet, seed_fleet
from rgpu_kubesim.kubelet import KubeletConfig, KubeletEmulator
from rgpu_kubesim.scheduler import SchedulerConfig, SchedulerEmulator

from .processes import ProcessGroup, ServiceProcess, free_port, wait_ready

__all__ = ["SERVICES", "Stack", "StackOptions", "run_stack", "service_account"]

SERVICES = ("discovery", "allocator", "extender", "metrics")
SYSTEM_NAMESPACE = "rgpu-system"


def service_account(service: str) -> str:
    """The user a service acts as, named like the service accounts k8s/base deploys."""
    return f"system:serviceaccount:{SYSTEM_NAMESPACE}:rgpu-{service}"


# The webhook trusts exactly the services that write scheduler-owned annotations, as k8s/base.
TRUSTED_USERS = ",".join(service_account(s) for s in ("allocator", "extender"))


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
    work_dir: Path | None = None
    apiserver_port: int = 0
    extra_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Per-service extra environment (``{"extender": {"OTEL_...": ...}}``)."""
    prepare: Callable[[Store], None] | None = None
    """Writes objects straight into the store before the services start, as a cluster has
    them before rgpu is installed (the system benchmark's background pods)."""


@dataclass(slots=True, kw_only=True)
class Stack:
    """A running system: handles to every part, for driving and for checking."""

    options: StackOptions
    sim: SimApiServer
    fleet: SeededFleet
    services: dict[str, ServiceProcess]
    scheduler: SchedulerEmulator
    kubelet: KubeletEmulator
    work_dir: Path
    webhook_url: str
    apiserver: httpx.AsyncClient

    def url(self, service: str) -> str:
        return self.services[service].url

    async def restart(self, service: str, *, hard: bool = True) -> None:
        """Kill (SIGKILL when ``hard``) and start ``service`` again, waiting until ready."""
        process = self.services[service]
        if hard:
            await process.kill()
        else:
            await process.stop()
        process.start()
        await wait_ready(process)

    async def create_pod(self, manifest: dict[str, Any], *, user: str = "alice") -> httpx.Response:
        """Create a pod through the apiserver (and so through the admission webhook)."""
        namespace = manifest["metadata"].get("namespace", "default")
        return await self.apiserver.post(
            f"/api/v1/namespaces/{namespace}/pods", json=manifest, headers={"X-Sim-User": user}
        )


def _write_certs(work_dir: Path) -> tuple[Path, Path, bytes]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost", "rgpu-extender.rgpu-system.svc")
    cert_file, key_file = work_dir / "tls.crt", work_dir / "tls.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return cert_file, key_file, ca.cert_pem.bytes()


def _webhook_configuration(url: str, ca_pem: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "rgpu-webhook"},
        "webhooks": [
            {
                "name": "pods.rgpu.io",
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
                "rules": [
                    {
                        "operations": ["CREATE", "UPDATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
                "reinvocationPolicy": "IfNeeded",
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": ["kube-system", SYSTEM_NAMESPACE],
                        }
                    ]
                },
            }
        ],
    }


def _service_env(options: StackOptions, sim_url: str, ports: Mapping[str, int]) -> dict[str, str]:
    return {
        "RGPU_KUBE_URL": sim_url,
        "RGPU_DISCOVERY_URL": f"http://127.0.0.1:{ports['discovery']}",
        "RGPU_ALLOCATOR_URL": f"http://127.0.0.1:{ports['allocator']}",
        "RGPU_GRANULARITY": options.granularity,
        "RGPU_BOOKING_TTL_SECONDS": f"{options.booking_ttl_seconds:g}",
        "RGPU_PROBE_INTERVAL_SECONDS": f"{options.probe_interval_seconds:g}",
        "RGPU_PROBE_TIMEOUT_SECONDS": "1",
        "RGPU_TRUSTED_USERS": TRUSTED_USERS,
        "RGPU_LOG_FORMAT": "json",
        "RGPU_NAMESPACE": SYSTEM_NAMESPACE,
    }


def _processes(
    options: StackOptions, sim_url: str, work_dir: Path, cert: Path, key: Path
) -> tuple[dict[str, ServiceProcess], str]:
    ports = {name: free_port() for name in SERVICES}
    webhook_port = free_port()
    common = _service_env(options, sim_url, ports)
    group = ProcessGroup()
    processes = {}
    for name in SERVICES:
        env = {
            **common,
            "RGPU_LISTEN": f"127.0.0.1:{ports[name]}",
            **options.extra_env.get(name, {}),
        }
        if name == "extender":
            env |= {
                "RGPU_WEBHOOK_LISTEN": f"127.0.0.1:{webhook_port}",
                "RGPU_TLS_CERT_FILE": str(cert),
                "RGPU_TLS_KEY_FILE": str(key),
            }
        processes[name] = ServiceProcess(
            service=name,
            env=env,
            log_dir=work_dir,
            url=f"http://127.0.0.1:{ports[name]}",
            group=group,
        )
    return processes, f"https://127.0.0.1:{webhook_port}/mutate"


@asynccontextmanager
async def run_stack(options: StackOptions = StackOptions()) -> AsyncIterator[Stack]:
    """Run the whole system until the block exits; every process is stopped on the way out."""
    async with AsyncExitStack() as stack:
        work_dir = options.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work_dir.mkdir(parents=True, exist_ok=True)
        # Each service's kube client announces itself as rgpu-<service>; the simulated
        # apiserver maps that to its service account, as token authentication would.
        agents = {f"rgpu-{s}": service_account(s) for s in SERVICES}
        api_options = ApiOptions(seed=options.seed, user_agents=agents)
        sim = await stack.enter_async_context(
            run_apiserver(port=options.apiserver_port, options=api_options)
        )
        sim.store.create("namespaces", {"metadata": {"name": SYSTEM_NAMESPACE}})
        plan = plan_fleet(
            FleetSpec(
                servers=options.servers,
                cards=options.cards,
                clients=options.clients,
                seed=options.seed,
            )
        )
        fleet = await stack.enter_async_context(seed_fleet(sim.store, plan))
        if options.prepare is not None:
            options.prepare(sim.store)
        cert, key, ca_pem = _write_certs(work_dir)
        services, webhook_url = _processes(options, sim.url, work_dir, cert, key)
        stack.push_async_callback(services[SERVICES[0]].group.stop)
        for name in SERVICES:
            services[name].start()
        for name in SERVICES:
            await wait_ready(services[name])
        sim.store.create(
            "mutatingwebhookconfigurations", _webhook_configuration(webhook_url, ca_pem)
        )
        apiserver = await stack.enter_async_context(httpx.AsyncClient(base_url=sim.url, timeout=10))
        emulated = httpx.AsyncClient(base_url=sim.url, timeout=10)
        await stack.enter_async_context(emulated)
        scheduler = SchedulerEmulator(
            SchedulerConfig(
                extender_url=services["extender"].url,
                unschedulable_flush_seconds=options.unschedulable_flush_seconds,
                max_backoff_seconds=options.max_backoff_seconds,
                seed=options.seed,
            ),
            emulated,
        )
        kubelet = KubeletEmulator(options.kubelet, emulated, fleet.lupine.get)
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        await tg.start(scheduler.run)
        await tg.start(kubelet.run)
        yield Stack(
            options=options,
            sim=sim,
            fleet=fleet,
            services=services,
            scheduler=scheduler,
            kubelet=kubelet,
            work_dir=work_dir,
            webhook_url=webhook_url,
            apiserver=apiserver,
        )
