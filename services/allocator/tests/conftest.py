"""Builders for fleets, pods and requests shared by the allocator's tests."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence

import anyio
import anyio.abc
import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_allocator import create_app
from rgpu_allocator.leases import ANNOTATION_CLAIMS, ANNOTATION_SERVER, lease_name
from rgpu_contracts import (
    AllocationRequest,
    Card,
    ContainerKind,
    ContainerRequest,
    Fleet,
    GpuUuid,
    NodeName,
    NodeTopology,
    PodRef,
    PodUID,
    Server,
    ServerName,
    Topology,
    card_id,
)
from rgpu_kubesim import ApiError, ApiOptions, SimApiServer, run_apiserver
from rgpu_runtime import Listener, Settings, running


class Build:
    """Small constructors so each test states only what it is about."""

    @staticmethod
    def uuid(server: str, index: int) -> str:
        return f"GPU-{server}-{index}"

    def card(
        self,
        server: str,
        index: int,
        *,
        memory: int = 40000,
        cores: int = 100,
        healthy: bool = True,
    ) -> Card:
        uuid = self.uuid(server, index)
        return Card(
            id=card_id(server, uuid),
            server=ServerName(server),
            uuid=GpuUuid(uuid),
            index=index,
            memory_mib=memory,
            cores=cores,
            model="A100",
            numa=0,
            healthy=healthy,
        )

    def server(
        self,
        name: str,
        *,
        cards: int = 4,
        memory: int | Sequence[int] = 40000,
        unhealthy: Iterable[int] = (),
        busy: Iterable[int] = (),
        ready: bool = True,
        reachable: bool = True,
        endpoint: str | None = "default",
        labels: Mapping[str, str] | None = None,
        port: int = 14833,
    ) -> Server:
        sick = set(unhealthy)
        sizes = [memory] * cards if isinstance(memory, int) else list(memory)
        made = tuple(
            self.card(name, i, memory=sizes[i], healthy=i not in sick) for i in range(len(sizes))
        )
        return Server(
            name=ServerName(name),
            endpoint=f"10.0.0.{len(name)}:{port}" if endpoint == "default" else endpoint,
            port=port,
            ready=ready,
            reachable=reachable,
            usage_reported=True,
            busy=frozenset(GpuUuid(self.uuid(name, i)) for i in busy),
            topology=tuple(sorted((labels or {}).items())),
            cards=made,
        )

    @staticmethod
    def fleet(*servers: Server, revision: int = 1) -> Fleet:
        return Fleet(revision=revision, observed_at=0.0, servers=servers)

    @staticmethod
    def topology(nodes: Mapping[str, Mapping[str, str]], revision: int = 1) -> Topology:
        return Topology(
            revision=revision,
            nodes=tuple(
                NodeTopology(name=NodeName(n), labels=tuple(sorted(labels.items())))
                for n, labels in nodes.items()
            ),
        )

    @staticmethod
    def container(
        name: str = "main", count: int = 1, memory: int = 0, kind: str = "app"
    ) -> ContainerRequest:
        return ContainerRequest(name=name, kind=ContainerKind(kind), count=count, memory_mib=memory)

    @staticmethod
    def pod(name: str = "p", namespace: str = "ml", uid: str | None = None) -> PodRef:
        return PodRef(uid=PodUID(uid or f"uid-{name}"), namespace=namespace, name=name)

    def request(
        self,
        name: str = "p",
        *containers: ContainerRequest,
        candidates: Sequence[str] = (),
        dry_run: bool = False,
        uid: str | None = None,
    ) -> AllocationRequest:
        return AllocationRequest(
            pod=self.pod(name, uid=uid),
            containers=containers or (self.container(),),
            candidate_nodes=tuple(NodeName(n) for n in candidates),
            dry_run=dry_run,
        )


@pytest.fixture
def build() -> Build:
    return Build()


# --- the running service: kubesim over real HTTP, a fake discovery at the transport -------


_PROBE = re.compile(r"/v1/servers/([^/]+)/probe")


class FakeDiscovery:
    """Serves ``Fleet`` and ``Topology`` JSON with discovery's long-poll rules, and answers
    ``POST /v1/servers/{name}/probe`` with ``probed[name]`` (else the server as published)
    or with ``probe_status`` when that is not 200; ``probes`` lists the servers asked for.

    Use ``handler`` with ``httpx.MockTransport`` (in-process apps) or ``asgi()`` behind a
    loopback server (subprocess allocators).
    """

    def __init__(self, fleet: Fleet, topology: Topology | None = None) -> None:
        self.fleet = fleet
        self.topology = topology or Topology(revision=1, nodes=())
        self.available = True
        self.closed = False
        self.probed: dict[str, Server] = {}
        self.probe_status = 200
        self.probes: list[str] = []
        self._changed: anyio.Event | None = None

    def close(self) -> None:
        """Answer every held long-poll now (so a server in front of it stops promptly)."""
        self.closed = True
        if self._changed is not None:
            self._changed.set()

    def publish(self, *servers: Server, topology: Topology | None = None) -> None:
        """Replace the servers (and/or topology) and wake long-polls."""
        if servers:
            self.fleet = Fleet(
                revision=self.fleet.revision + 1, observed_at=time.time(), servers=servers
            )
        if topology is not None:
            self.topology = dataclasses.replace(topology, revision=self.topology.revision + 1)
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def answer(self, path: str, since: str | None, wait: str | None) -> tuple[int, bytes]:
        if not self.available:
            return 503, b'{"code": "down", "message": "discovery is down", "retryable": true}'
        current = self.fleet if path.endswith("fleet") else self.topology
        if since is not None and int(since) == current.revision and not self.closed:
            if self._changed is None:
                self._changed = anyio.Event()
            with anyio.move_on_after(float(wait or 30)):
                await self._changed.wait()
            current = self.fleet if path.endswith("fleet") else self.topology
        return 200, orjson.dumps(current.to_dict())

    def probe(self, name: str) -> tuple[int, bytes]:
        self.probes.append(name)
        found = self.probed.get(name) or self.fleet.server(name)
        if self.probe_status != 200 or found is None:
            status = self.probe_status if found is not None else 404
            return status, b'{"code": "probe", "message": "not probed", "retryable": false}'
        return 200, orjson.dumps(found.to_dict())

    async def handler(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        path = request.url.path
        if request.method == "POST" and (probe := _PROBE.fullmatch(path)) is not None:
            status, body = self.probe(probe.group(1))
        else:
            status, body = await self.answer(path, params.get("since"), params.get("wait"))
        return httpx.Response(status, content=body, headers={"content-type": "application/json"})

    def asgi(self) -> Starlette:
        async def endpoint(request: Request) -> Response:
            q = request.query_params
            status, body = await self.answer(request.url.path, q.get("since"), q.get("wait"))
            return Response(body, status, media_type="application/json")

        async def probe(request: Request) -> Response:
            status, body = self.probe(request.path_params["name"])
            return Response(body, status, media_type="application/json")

        routes = [
            Route("/v1/fleet", endpoint),
            Route("/v1/topology", endpoint),
            Route("/v1/servers/{name}/probe", probe, methods=["POST"]),
        ]
        return Starlette(routes=routes)


def allocator_env(sim_url: str, **extra: str) -> dict[str, str]:
    env = {
        "RGPU_KUBE_URL": sim_url,
        "RGPU_DISCOVERY_URL": "http://discovery.test",
        "RGPU_LISTEN": "127.0.0.1:0",
        "RGPU_LOG_LEVEL": "WARNING",
    }
    env.update(extra)
    return env


def settings_for(sim_url: str, **extra: str) -> Settings:
    return Settings.from_env(allocator_env(sim_url, **extra), service="allocator")


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll ``check`` until it is true; fails the test after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while True:
            if await check():
                return
            # The state lives in another server (kubesim, the allocator's tasks): poll it.
            await anyio.sleep(0.02)


async def wait_fleet(client: httpx.AsyncClient) -> None:
    async def known() -> bool:
        status = (await client.get("/v1/status")).json()
        return status["fleetRevision"] is not None and status["synced"]

    await wait_for(known)


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
        discovery_transport=httpx.MockTransport(discovery.handler),
        registry=registry,
    )
    async with (
        LifespanManager(app, startup_timeout=20, shutdown_timeout=20) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://allocator"
        ) as client,
    ):
        if wait:
            await wait_fleet(client)
        yield client


class Cluster:
    """Pods in kubesim, made the way kube-apiserver would hold them."""

    def __init__(self, sim: SimApiServer) -> None:
        self.sim = sim
        for namespace in ("ml", "rgpu-system"):
            self.sim.store.create("namespaces", {"metadata": {"name": namespace}})

    def pod(
        self,
        name: str,
        *,
        namespace: str = "ml",
        scheduler: str = "rgpu-scheduler",
        annotations: Mapping[str, str] | None = None,
        containers: Sequence[str] = ("main",),
        init: Sequence[str] = (),
    ) -> PodRef:
        spec: dict[str, object] = {
            "schedulerName": scheduler,
            "containers": [{"name": c, "image": "busybox:1.36"} for c in containers],
        }
        if init:
            spec["initContainers"] = [{"name": c, "image": "busybox:1.36"} for c in init]
        made = self.sim.store.create(
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "annotations": dict(annotations or {}),
                },
                "spec": spec,
            },
        )
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
            server = lease["metadata"]["annotations"].get(ANNOTATION_SERVER)
            text = lease["metadata"]["annotations"].get(ANNOTATION_CLAIMS, "[]")
            out[server] = sorted(c["pod"]["name"] for c in orjson.loads(text))
        return out


def ask(
    pod: PodRef,
    *containers: ContainerRequest,
    candidates: Sequence[str] = (),
    dry_run: bool = False,
) -> dict[str, object]:
    """An ``AllocationRequest`` body for ``pod``."""
    request = AllocationRequest(
        pod=pod,
        containers=containers or (ContainerRequest(name="main", kind=ContainerKind.APP, count=1),),
        candidate_nodes=tuple(NodeName(n) for n in candidates),
        dry_run=dry_run,
    )
    return dict(request.to_dict())


@pytest.fixture
async def sim() -> AsyncIterator[SimApiServer]:
    async with run_apiserver(options=ApiOptions(bookmark_interval_seconds=0.2)) as server:
        yield server


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
            async with httpx.AsyncClient(base_url=found[0], timeout=30) as client:
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


@contextlib.asynccontextmanager
async def discovery_server(discovery: FakeDiscovery) -> AsyncIterator[str]:
    """Serve ``discovery`` on an ephemeral loopback port; yields its base URL."""
    try:
        async with running(discovery.asgi(), Listener(listen="127.0.0.1:0")) as urls:
            try:
                yield urls[0]
            finally:
                discovery.close()
    finally:
        discovery.closed = False


class Kit:
    """The helpers above, for test modules (importlib mode cannot import conftest)."""

    FakeDiscovery = FakeDiscovery
    allocator_process = staticmethod(allocator_process)
    ask = staticmethod(ask)
    discovery_server = staticmethod(discovery_server)
    allocator_env = staticmethod(allocator_env)
    running_allocator = staticmethod(running_allocator)
    settings_for = staticmethod(settings_for)
    wait_for = staticmethod(wait_for)
    wait_fleet = staticmethod(wait_fleet)


@pytest.fixture
def kit() -> Kit:
    return Kit()
