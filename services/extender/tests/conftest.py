"""Fixtures for the extender: pod builders, fake allocator and discovery at the transport, the
real app over kubesim (a real apiserver on loopback, reached by the real kubernetes client)."""

from __future__ import annotations

import base64
import copy
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
import httpx
import jsonpatch
import orjson
import pytest
import trustme
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

import rgpu_testkit as testkit
from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_ENDPOINT,
    ANNOTATION_TO_ALLOCATE,
    Allocation,
    AllocationRequest,
    Card,
    ClaimState,
    ContainerAssignment,
    ErrorBody,
    Fleet,
    NoFit,
    PodRef,
    PodUID,
    Reason,
    ReasonCount,
    Server,
    ServerName,
    Topology,
    card_id,
)
from rgpu_extender import create_app, listeners
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_runtime.feeds import Versioned
from rgpu_runtime.serving import running

COUNT = "nvidia.com/remote-gpu"
MEMORY = "nvidia.com/remote-gpu-memory"
ENDPOINT_PATH = "metadata.annotations['hami.io/lupine-endpoint']"
NAMESPACE = "ml-team"
IMAGE = "registry.example.com/ml/trainer:1.4"

Json = dict[str, Any]


class Build:
    """Builders for pods and extender requests (the ``build`` fixture)."""

    COUNT = COUNT
    MEMORY = MEMORY
    NAMESPACE = NAMESPACE

    @staticmethod
    def endpoint_env() -> Json:
        """The env entry the webhook wires for the endpoint."""
        return {
            "name": "LUPINE_SERVER",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": ENDPOINT_PATH}},
        }

    @staticmethod
    def container(
        name: str = "main",
        *,
        count: object = None,
        memory: object = None,
        env: list[Json] | None = None,
        wired: bool = True,
        **extra: Any,
    ) -> Json:
        """A container asking for ``count`` cards (limits) of ``memory`` MiB; wired by default."""
        limits: Json = {"memory": "2Gi"}
        if count is not None:
            limits[COUNT] = count
        if memory is not None:
            limits[MEMORY] = memory
        if env is None and wired and count is not None:
            env = [Build.endpoint_env()]
        body = testkit.container_manifest(name=name, image=IMAGE, limits=limits, env=env)
        return {**body, **extra}

    @staticmethod
    def seed_pod(sim: SimApiServer, the_pod: Json) -> Json:
        """Create ``the_pod`` in kubesim (without its uid: the apiserver assigns one)."""
        body = copy.deepcopy(the_pod)
        body["metadata"].pop("uid", None)
        return sim.store.create("pods", body, namespace=NAMESPACE)

    @staticmethod
    def pod(
        *containers: Json,
        init: Iterable[Json] = (),
        name: str = "trainer-0",
        uid: str = "8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f",
        annotations: Mapping[str, str] | None = None,
        scheduler: str | None = "rgpu-scheduler",
        **spec: Any,
    ) -> Json:
        """A pod in ``ml-team`` with ``containers`` (default: one asking for one card)."""
        return testkit.pod_manifest(
            name=name,
            namespace=NAMESPACE,
            uid=uid,
            annotations=annotations,
            containers=list(containers) or [Build.container(count="1")],
            init_containers=init,
            scheduler=scheduler,
            spec=spec,
        )

    @staticmethod
    def filter_args(the_pod: Json, nodes: Iterable[str]) -> Json:
        return {"Pod": the_pod, "Nodes": None, "NodeNames": list(nodes)}

    @staticmethod
    def review(
        obj: Json | None,
        *,
        operation: str = "CREATE",
        old: Json | None = None,
        user: str = "kubernetes-admin",
        uid: str = "d2b7f0a4-9c3e-4f1b-8a6d-5e4c3b2a1f09",
    ) -> Json:
        """An AdmissionReview v1 for a pod ``operation``."""
        return {
            "kind": "AdmissionReview",
            "apiVersion": "admission.k8s.io/v1",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": NAMESPACE,
                "name": (obj or old or {}).get("metadata", {}).get("name", ""),
                "operation": operation,
                "userInfo": {"username": user, "groups": ["system:authenticated"]},
                "object": obj,
                "oldObject": old,
                "dryRun": False,
            },
        }

    @staticmethod
    def patched(review: Mapping[str, Any], obj: Json) -> Json:
        """``obj`` with the review's JSONPatch applied by the jsonpatch library."""
        response = review["response"]
        if "patch" not in response:
            return copy.deepcopy(obj)
        assert response["patchType"] == "JSONPatch"
        ops = orjson.loads(base64.b64decode(response["patch"]))
        result: Json = jsonpatch.apply_patch(obj, ops)
        return result

    @staticmethod
    def settings(**env: str) -> ExtenderSettings:
        # The allocator is faked at the transport: its callers' tokens are tested there.
        base = {
            "RGPU_KUBE_URL": "http://127.0.0.1:9",
            "RGPU_LOG_FORMAT": "text",
            "RGPU_AUTH": "none",
        }
        return ExtenderSettings.from_env({**base, **env})


class Make:
    """Contract values the fake peers serve (the kit's builders); defaults describe a small
    healthy fleet."""

    @staticmethod
    def card(server: str, index: int) -> Card:
        return testkit.card(server=server, index=index)

    @staticmethod
    def server(name: str, *, labels: Mapping[str, str] | None = None) -> Server:
        return testkit.server(
            name=name, cards=2, endpoint=f"10.0.3.{len(name)}:14833", labels=labels
        )

    @staticmethod
    def no_fit() -> NoFit:
        return NoFit(
            reasons=(
                ReasonCount(reason=Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, count=2),
                ReasonCount(reason=Reason.CARD_INSUFFICIENT_MEMORY, count=2),
            ),
            total=4,
        )

    @staticmethod
    def fleet(*servers: Server, revision: int = 1) -> Fleet:
        return testkit.fleet(servers=servers, revision=revision, observed_at=1.0)

    @staticmethod
    def topology(nodes: Mapping[str, Mapping[str, str]], revision: int = 1) -> Topology:
        return testkit.topology(nodes=nodes, revision=revision)


RACK, ZONE, REGION = (
    "topology.rgpu.io/rack",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
)


def default_fleet() -> Fleet:
    make = Make()
    return make.fleet(
        make.server("gpu-node-2", labels={RACK: "r1", ZONE: "z1", REGION: "eu"}),
        make.server("lupine-b", labels={RACK: "r9", ZONE: "z2", REGION: "eu"}),
    )


def default_topology() -> Topology:
    return Make.topology(
        {
            "gpu-node-1": {RACK: "r1", ZONE: "z1", REGION: "eu"},
            "cpu-node-1": {RACK: "r2", ZONE: "z1", REGION: "eu"},
            "cpu-node-2": {RACK: "r7", ZONE: "z3", REGION: "eu"},
            "cpu-node-3": {RACK: "r7", ZONE: "z3", REGION: "us"},
        }
    )


def _json(status: int, body: object) -> httpx.Response:
    return httpx.Response(
        status, content=orjson.dumps(body), headers={"content-type": "application/json"}
    )


@dataclass
class FakeAllocator:
    """The allocator's HTTP API, served from contract values; records what it was asked."""

    server: str = "gpu-node-2"
    endpoint: str = "10.0.3.50:14833"
    no_fit: NoFit | None = None
    fail: tuple[int, str] | None = None
    """(status, message): answer every call with this ErrorBody."""
    commit_status: int | None = None
    """Answer commits with this status and an ErrorBody (404/409 = claim not held)."""
    commit_uid: str | None = None
    """Pretend the committed claim belongs to this uid (a broken or hostile allocator)."""
    commit_annotations: Mapping[str, str] | None = None
    delay: float = 0.0
    raise_error: Exception | None = None
    claims: dict[str, Allocation] = field(default_factory=dict)
    requests: list[AllocationRequest] = field(default_factory=list)
    commits: list[tuple[str, str]] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    headers: list[httpx.Headers] = field(default_factory=list)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def allocation(self, ref: PodRef, *, committed: bool = False) -> Allocation:
        cards = (card_id(self.server, "GPU-0"), card_id(self.server, "GPU-1"))
        return Allocation(
            pod=ref,
            server=ServerName(self.server),
            endpoint=self.endpoint,
            cards=cards,
            containers=(ContainerAssignment(name="main", cards=cards),),
            state=ClaimState.COMMITTED if committed else ClaimState.BOOKED,
            booked_at=1.0,
            expires_at=31.0,
            annotations=tuple(sorted(self._annotations(cards).items())) if committed else (),
        )

    def _annotations(self, cards: Iterable[str]) -> Mapping[str, str]:
        if self.commit_annotations is not None:
            return self.commit_annotations
        devices = "".join(f"{c},RemoteGPU,40960,100:" for c in cards) + ";"
        return {
            ANNOTATION_TO_ALLOCATE: devices,
            ANNOTATION_ALLOCATED: devices,
            ANNOTATION_ENDPOINT: self.endpoint,
        }

    def hold(self, uid: str, name: str = "trainer-0") -> None:
        """Pretend the pod already booked a server."""
        ref = PodRef(uid=PodUID(uid), namespace=NAMESPACE, name=name)
        self.claims[uid] = self.allocation(ref)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.headers.append(request.headers)
        if self.delay:
            await anyio.sleep(self.delay)
        if self.raise_error is not None:
            raise self.raise_error
        if self.fail is not None:
            status, message = self.fail
            return _json(status, ErrorBody(code="boom", message=message, retryable=True).to_dict())
        return self._route(request)

    def _route(self, request: httpx.Request) -> httpx.Response:
        parts = [unquote(p) for p in request.url.path.strip("/").split("/")]
        if request.method == "POST" and parts == ["v1", "allocations"]:
            return self._allocate(orjson.loads(request.content))
        if request.method == "POST" and len(parts) == 4 and parts[3] == "commit":
            return self._commit(parts[2], orjson.loads(request.content)["node"])
        if request.method == "DELETE" and len(parts) == 3:
            self.released.append(parts[2])
            self.claims.pop(parts[2], None)
            return httpx.Response(204)
        if request.method == "GET" and len(parts) == 3:
            found = self.claims.get(parts[2])
            if found is None:
                return _json(404, ErrorBody(code="not_found", message="no claim").to_dict())
            return _json(200, found.to_dict())
        return _json(404, ErrorBody(code="not_found", message="no route").to_dict())

    def _allocate(self, raw: object) -> httpx.Response:
        request = AllocationRequest.from_dict(raw)
        self.requests.append(request)
        if self.no_fit is not None:
            return _json(409, self.no_fit.to_dict())
        allocation = self.allocation(request.pod)
        self.claims[request.pod.uid] = allocation
        return _json(200, allocation.to_dict())

    def _commit(self, uid: str, node: str) -> httpx.Response:
        self.commits.append((uid, node))
        if self.commit_status is not None:
            body = ErrorBody(code="conflict", message=f"claim of {uid} is not held")
            return _json(self.commit_status, body.to_dict())
        held = self.claims.get(uid)
        if held is None:
            return _json(404, ErrorBody(code="not_found", message=f"no claim for {uid}").to_dict())
        ref = (
            held.pod
            if self.commit_uid is None
            else PodRef(
                uid=PodUID(self.commit_uid), namespace=held.pod.namespace, name=held.pod.name
            )
        )
        committed = self.allocation(ref, committed=True)
        self.claims[uid] = committed
        return _json(200, committed.to_dict())


class FakeDiscovery(testkit.FakeDiscovery):
    """The kit's fake discovery; this suite's tests read ``fleet`` as the versioned store."""

    @property  # type: ignore[override]
    def fleet(self) -> Versioned[Fleet]:
        return self.fleets


@dataclass(frozen=True, slots=True, kw_only=True)
class Extender:
    """The running app: a client for its ASGI interface, the app and its metrics registry."""

    client: httpx.AsyncClient
    app: Starlette
    registry: CollectorRegistry

    def metric(self, name: str, labels: Mapping[str, str]) -> float:
        return self.registry.get_sample_value(name, dict(labels)) or 0.0


OpenExtender = Callable[..., AbstractAsyncContextManager[Extender]]


@pytest.fixture
async def sim() -> AsyncIterator[SimApiServer]:
    async with run_apiserver() as server:
        server.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
        yield server


@pytest.fixture
def allocator() -> FakeAllocator:
    return FakeAllocator()


@pytest.fixture
def discovery() -> FakeDiscovery:
    return FakeDiscovery(default_fleet(), default_topology())


@pytest.fixture
def open_extender(
    sim: SimApiServer, allocator: FakeAllocator, discovery: FakeDiscovery
) -> OpenExtender:
    @asynccontextmanager
    async def open_(**env: str) -> AsyncIterator[Extender]:
        settings = Build.settings(RGPU_KUBE_URL=sim.url, **env)
        registry = CollectorRegistry()
        app = create_app(
            settings,
            allocator_transport=allocator.transport,
            discovery_transport=discovery.transport,
            registry=registry,
        )
        async with LifespanManager(app) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://extender") as c:
                yield Extender(client=c, app=app, registry=registry)

    return open_


@pytest.fixture
async def extender(open_extender: OpenExtender) -> AsyncIterator[Extender]:
    async with open_extender() as running:
        yield running


@pytest.fixture
def build() -> Build:
    return Build()


@pytest.fixture
def make() -> Make:
    return Make()


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """The CA of the extender's serving certificate (the webhook's ``caBundle``)."""
    return trustme.CA()


@pytest.fixture
def cert_files(ca: trustme.CA, tmp_path: Path) -> tuple[Path, Path]:
    leaf = ca.issue_cert("127.0.0.1", "extender.rgpu-system.svc")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    leaf.private_key_pem.write_to_path(key)
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return cert, key


ServeExtender = Callable[..., AbstractAsyncContextManager[tuple[str, str]]]


@pytest.fixture
def serve_extender(
    build: Build,
    sim: SimApiServer,
    allocator: FakeAllocator,
    discovery: FakeDiscovery,
    cert_files: tuple[Path, Path],
) -> ServeExtender:
    """The extender on real sockets, as ``main`` serves it: (scheduler URL, webhook URL)."""

    @asynccontextmanager
    async def serve(**env: str) -> AsyncIterator[tuple[str, str]]:
        cert, key = cert_files
        settings = build.settings(
            RGPU_KUBE_URL=sim.url,
            RGPU_LISTEN="127.0.0.1:0",
            RGPU_WEBHOOK_LISTEN="127.0.0.1:0",
            RGPU_TLS_CERT_FILE=str(cert),
            RGPU_TLS_KEY_FILE=str(key),
            **env,
        )
        app = create_app(
            settings,
            allocator_transport=allocator.transport,
            discovery_transport=discovery.transport,
            registry=CollectorRegistry(),
        )
        async with running(app, *listeners(settings)) as (scheduler, webhook):
            yield scheduler, webhook

    return serve


@pytest.fixture
def webhook_configuration(ca: trustme.CA) -> Callable[[str, list[str]], Json]:
    """Builds a MutatingWebhookConfiguration sending every pod ``operation`` to ``url``/mutate
    (no matchConditions: the extender must be right for every pod it is sent)."""
    return lambda url, operations: _webhook_configuration(url, ca, operations)


def _webhook_configuration(url: str, ca: trustme.CA, operations: list[str]) -> Json:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "rgpu"},
        "webhooks": [
            {
                "name": "pods.rgpu.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {
                    "url": f"{url}/mutate",
                    "caBundle": base64.b64encode(ca.cert_pem.bytes()).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": operations,
                        "resources": ["pods"],
                    }
                ],
            }
        ],
    }
