"""Builders for fleets, pods and requests shared by the allocator's tests."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc
import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

import rgpu_testkit as testkit
from rgpu_allocator import create_app
from rgpu_allocator.claims import ANNOTATION_CLAIMS, ANNOTATION_SERVER, lease_name
from rgpu_allocator.settings import AllocatorSettings
from rgpu_contracts import (
    AllocationRequest,
    Card,
    ContainerRequest,
    Fleet,
    PodRef,
    PodUID,
    Server,
    Topology,
)
from rgpu_kubesim import ApiError, ApiOptions, SimApiServer, run_apiserver
from rgpu_runtime.kube import kube_client
from rgpu_runtime.peers import ALLOCATOR_AUDIENCE, BearerAuth, TokenRequestSource
from rgpu_runtime.settings import Settings
from rgpu_testkit import FakeDiscovery, eventually

MODEL = "A100"
NAMESPACE = "rgpu-system"
EXTENDER_ACCOUNT = "rgpu-extender"
EXTENDER = f"system:serviceaccount:{NAMESPACE}:{EXTENDER_ACCOUNT}"
"""The one caller the allocator's writes accept in these tests, as k8s/ deploys it."""
ACCOUNTS = (EXTENDER_ACCOUNT, "rgpu-allocator", "intruder")


class Build:
    """The kit's builders with this suite's defaults and positional names, so each test
    states only what it is about."""

    @staticmethod
    def uuid(server: str, index: int) -> str:
        return testkit.gpu_uuid(server=server, index=index)

    @staticmethod
    def card(
        server: str, index: int, *, memory: int = 40000, cores: int = 100, healthy: bool = True
    ) -> Card:
        return testkit.card(
            server=server, index=index, memory_mib=memory, cores=cores, model=MODEL, healthy=healthy
        )

    @staticmethod
    def server(
        name: str,
        *,
        cards: int = 4,
        memory: int | Sequence[int] = 40000,
        unhealthy: Iterable[int] = (),
        busy: Iterable[int] = (),
        ready: bool = True,
        reachable: bool = True,
        endpoint: str | None = testkit.AUTO_ENDPOINT,
        labels: Mapping[str, str] | None = None,
        port: int = 14833,
    ) -> Server:
        return testkit.server(
            name=name,
            cards=cards,
            memory_mib=memory,
            model=MODEL,
            unhealthy=unhealthy,
            busy=busy,
            ready=ready,
            reachable=reachable,
            endpoint=endpoint,
            labels=labels,
            port=port,
        )

    @staticmethod
    def fleet(*servers: Server, revision: int = 1) -> Fleet:
        return testkit.fleet(servers=servers, revision=revision)

    @staticmethod
    def topology(nodes: Mapping[str, Mapping[str, str]], revision: int = 1) -> Topology:
        return testkit.topology(nodes=nodes, revision=revision)

    @staticmethod
    def container(
        name: str = "main", count: int = 1, memory: int = 0, kind: str = "app"
    ) -> ContainerRequest:
        return testkit.container_request(name=name, kind=kind, count=count, memory_mib=memory)

    @staticmethod
    def pod(name: str = "p", namespace: str = "ml", uid: str | None = None) -> PodRef:
        return testkit.pod_ref(name=name, namespace=namespace, uid=uid)

    def request(
        self,
        name: str = "p",
        *containers: ContainerRequest,
        candidates: Sequence[str] = (),
        dry_run: bool = False,
        uid: str | None = None,
    ) -> AllocationRequest:
        return testkit.allocation_request(
            pod=self.pod(name, uid=uid),
            containers=containers,
            candidates=candidates,
            dry_run=dry_run,
        )


@pytest.fixture
def build() -> Build:
    return Build()


# --- the running service: kubesim over real HTTP, a fake discovery at the transport -------


def allocator_env(sim_url: str, **extra: str) -> dict[str, str]:
    env = {
        "RGPU_KUBE_URL": sim_url,
        "RGPU_DISCOVERY_URL": "http://discovery.test",
        "RGPU_LISTEN": "127.0.0.1:0",
        "RGPU_LOG_LEVEL": "WARNING",
        # Authenticated as k8s/ deploys it: writes need the extender's token (audience
        # rgpu-allocator).
        "RGPU_AUTH": "tokenreview",
        "RGPU_ALLOCATION_CALLERS": EXTENDER,
        "RGPU_TOKEN_ACCOUNT": "rgpu-allocator",
    }
    env.update(extra)
    return env


def settings_for(sim_url: str, **extra: str) -> AllocatorSettings:
    return AllocatorSettings.from_env(allocator_env(sim_url, **extra))


async def wait_fleet(client: httpx.AsyncClient) -> None:
    async def known() -> bool:
        status = (await client.get("/v1/status")).json()
        return status["fleetRevision"] is not None and status["synced"]

    await eventually(known, what="the allocator synced a fleet")


@contextlib.asynccontextmanager
async def caller(
    sim_url: str, account: str = EXTENDER_ACCOUNT, **source: Any
) -> AsyncIterator[BearerAuth]:
    """Tokens of ``account`` minted through TokenRequest, as a caller gets them in the
    simulated cluster (``source`` goes to ``TokenRequestSource``: audience, by default the
    allocator's, seconds)."""
    settings = Settings.from_env({"RGPU_KUBE_URL": sim_url}, service="extender")
    source = {"audience": ALLOCATOR_AUDIENCE, **source}
    async with kube_client(settings) as kube:
        yield BearerAuth(TokenRequestSource(kube, namespace=NAMESPACE, account=account, **source))


@contextlib.asynccontextmanager
async def running_allocator(
    sim_url: str,
    discovery: FakeDiscovery,
    registry: CollectorRegistry | None = None,
    *,
    wait: bool = True,
    **env: str,
) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process allocator (lifespan run) on kubesim, answering over ASGI; with ``wait``,
    yields once it holds the fleet."""
    app = create_app(
        settings_for(sim_url, **env),
        discovery_transport=discovery.transport,
        registry=registry,
    )
    async with (
        caller(sim_url) as auth,
        LifespanManager(app, startup_timeout=20, shutdown_timeout=20) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://allocator", auth=auth
        ) as client,
    ):
        if wait:
            await wait_fleet(client)
        yield client


class Cluster:
    """Pods in kubesim, made the way kube-apiserver would hold them."""

    def __init__(self, sim: SimApiServer) -> None:
        self.sim = sim

    def pod(
        self,
        name: str,
        *,
        namespace: str = "ml",
        scheduler: str = "rgpu-scheduler",
        annotations: Mapping[str, str] | None = None,
        containers: Sequence[str] = ("main",),
        init: Sequence[str] = (),
        limits: Mapping[str, str] | None = None,
    ) -> PodRef:
        """A pod; ``limits`` go on each of its (app) ``containers``."""
        manifest = testkit.pod_manifest(
            name=name,
            namespace=namespace,
            scheduler=scheduler,
            annotations=dict(annotations or {}),
            containers=[testkit.container_manifest(name=c, limits=limits) for c in containers],
            init_containers=[testkit.container_manifest(name=c) for c in init],
        )
        made = self.sim.store.create("pods", manifest)
        return PodRef(uid=PodUID(made["metadata"]["uid"]), namespace=namespace, name=name)

    def bind(self, pod: PodRef, node: str = "client-1", *, phase: str | None = "Running") -> None:
        self.sim.store.bind(pod.name, node, namespace=pod.namespace, uid=pod.uid)
        if phase is not None:
            self.phase(pod, phase)

    def phase(self, pod: PodRef, phase: str) -> None:
        self.sim.store.patch(
            "pods",
            pod.name,
            {"status": {"phase": phase}},
            namespace=pod.namespace,
            subresource="status",
        )

    def delete(self, pod: PodRef) -> None:
        # Forced (grace 0): no kubelet runs here to finish a graceful deletion.
        self.sim.store.delete("pods", pod.name, namespace=pod.namespace, grace_period_seconds=0)

    def annotations(self, pod: PodRef) -> dict[str, str]:
        got = self.sim.store.get("pods", pod.name, namespace=pod.namespace)
        return dict(got["metadata"].get("annotations") or {})

    def lease(self, server: str) -> dict[str, object] | None:
        try:
            return self.sim.store.get("leases", lease_name(server), namespace="rgpu-system")
        except ApiError:
            return None

    def claims(self, server: str) -> list[dict[str, object]]:
        lease = self.lease(server)
        if lease is None:
            return []
        text = lease["metadata"].get("annotations", {}).get(ANNOTATION_CLAIMS, "[]")
        return orjson.loads(text)

    def holders(self) -> dict[str, list[str]]:
        """Pod names holding claims, per server, straight from the stored Leases."""
        out: dict[str, list[str]] = {}
        for lease in self.sim.store.list("leases", namespace="rgpu-system"):
            annotations = lease["metadata"].get("annotations") or {}
            server = annotations.get(ANNOTATION_SERVER)
            if server is None:
                continue  # the leader election's Lease
            text = annotations.get(ANNOTATION_CLAIMS, "[]")
            out[server] = sorted(c["pod"]["name"] for c in orjson.loads(text))
        return out


def ask(
    pod: PodRef,
    *containers: ContainerRequest,
    candidates: Sequence[str] = (),
    dry_run: bool = False,
) -> dict[str, object]:
    """An ``AllocationRequest`` body for ``pod``."""
    request = testkit.allocation_request(
        pod=pod, containers=containers, candidates=candidates, dry_run=dry_run
    )
    return dict(request.to_dict())


@pytest.fixture
async def sim() -> AsyncIterator[SimApiServer]:
    async with run_apiserver(options=ApiOptions(bookmark_interval_seconds=0.2)) as server:
        prepare(server)
        yield server


def prepare(sim: SimApiServer) -> None:
    """The namespaces the tests use and the service accounts callers get tokens for."""
    for namespace in ("ml", NAMESPACE):
        sim.store.create("namespaces", {"metadata": {"name": namespace}})
    for account in ACCOUNTS:
        sim.store.create("serviceaccounts", {"metadata": {"name": account, "namespace": NAMESPACE}})


@pytest.fixture
def cluster(sim: SimApiServer) -> Cluster:
    return Cluster(sim)


_SERVING = re.compile(rb"serving on (http://127\.0\.0\.1:\d+)")


async def _drain(stream: anyio.abc.ByteReceiveStream, found: list[str], ready: anyio.Event) -> None:
    """Read the child's log (so it never blocks on a full pipe) and spot its URL."""
    buffer = b""
    async for chunk in stream:
        buffer = (buffer + chunk)[-65536:]
        match = _SERVING.search(buffer)
        if match and not found:
            found.append(match.group(1).decode())
            ready.set()
    ready.set()


@contextlib.asynccontextmanager
async def allocator_process(env: Mapping[str, str]) -> AsyncIterator[AllocatorProcess]:
    """``python -m rgpu_allocator`` as a child process; yields once it serves."""
    full = {**os.environ, **env, "RGPU_LOG_LEVEL": "INFO", "RGPU_LOG_FORMAT": "text"}
    process = await anyio.open_process(
        [sys.executable, "-m", "rgpu_allocator"], env=full, stdout=subprocess.DEVNULL
    )
    found: list[str] = []
    ready = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            assert process.stderr is not None
            tg.start_soon(_drain, process.stderr, found, ready)
            with anyio.fail_after(30):
                await ready.wait()
            assert found, f"the allocator exited ({process.returncode}) before serving"
            async with (
                caller(env["RGPU_KUBE_URL"]) as auth,
                httpx.AsyncClient(base_url=found[0], timeout=30, auth=auth) as client,
            ):
                await wait_fleet(client)
                yield AllocatorProcess(process=process, client=client)
            tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorProcess:
    """A running allocator child process and a client for it."""

    process: anyio.abc.Process
    client: httpx.AsyncClient


class Kit:
    """The helpers above, for test modules (importlib mode cannot import conftest)."""

    FakeDiscovery = FakeDiscovery
    allocator_process = staticmethod(allocator_process)
    ask = staticmethod(ask)
    discovery_server = staticmethod(FakeDiscovery.serving)
    allocator_env = staticmethod(allocator_env)
    caller = staticmethod(caller)
    prepare = staticmethod(prepare)
    running_allocator = staticmethod(running_allocator)
    settings_for = staticmethod(settings_for)
    wait_for = staticmethod(eventually)
    wait_fleet = staticmethod(wait_fleet)


@pytest.fixture
def kit() -> Kit:
    return Kit()
