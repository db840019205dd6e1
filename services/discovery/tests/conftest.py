"""Shared builders for discovery's tests: Node manifests shaped like a kubelet's, register
annotations shaped like HAMi's device plugin writes them, and settings dicts."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

import rgpu_testkit as testkit
from rgpu_contracts import Fleet, Server, Topology
from rgpu_contracts.hami import ANNOTATION_REGISTER, LABEL_SERVER
from rgpu_discovery import create_app
from rgpu_discovery.lupine import Dialer, dial_tcp
from rgpu_discovery.nodes import NodeView, node_view
from rgpu_discovery.probing import REPROBE_MIN_INTERVAL
from rgpu_discovery.settings import DiscoverySettings
from rgpu_discovery.state_writer import WriterPolicy
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_runtime.kube import kube_client
from rgpu_runtime.pacing import Backoff
from rgpu_runtime.peers import DISCOVERY_AUDIENCE, BearerAuth, TokenRequestSource
from rgpu_runtime.replicas import MembershipTiming
from rgpu_runtime.settings import Settings
from rgpu_testkit import eventually

NAMESPACE = "rgpu-system"
ALLOCATOR_ACCOUNT = "rgpu-allocator"
ALLOCATOR = f"system:serviceaccount:{NAMESPACE}:{ALLOCATOR_ACCOUNT}"
"""The one caller the on-demand probe accepts in these tests, as k8s/ deploys it."""

TOPOLOGY_KEYS = ("topology.rgpu.io/rack", "topology.kubernetes.io/zone")
FAST_BACKOFF = Backoff(initial=0.05, maximum=0.2)
"""Apiserver retries in tests: fast enough that recovery is seen within a second."""
FAST_MEMBERSHIP = MembershipTiming(lease_seconds=2.0, renew_seconds=0.25)
"""Replicas renew four times a second and are dead after two silent seconds (a loaded
2-core machine can starve a replica for a second)."""
FAST_WRITER = WriterPolicy(heartbeat_seconds=30.0, retry_seconds=0.1, reflect_seconds=2.0)
"""States retried ten times a second; no heartbeat inside a test unless it asks for one."""
RACK = "topology.rgpu.io/rack"
ZONE = "topology.kubernetes.io/zone"


def _register(*cards: Mapping[str, object]) -> str:
    """A register annotation value (compact JSON, as Go writes it)."""
    return testkit.register_annotation(dict(card) for card in cards)


def _card(uuid: str, index: int = 0, **extra: object) -> dict[str, object]:
    """One remote, healthy register entry; ``extra`` overrides or removes (value ``None``)."""
    entry: dict[str, object] = {**testkit.register_card(uuid=uuid, index=index), "numa": 0}
    entry.update(extra)
    return {key: value for key, value in entry.items() if value is not None}


def _node(
    name: str,
    *,
    server: str | None = "",
    ip: str | None = "10.0.0.1",
    addresses: Sequence[Mapping[str, str]] | None = None,
    ready: str | None = "True",
    annotation: str | None = None,
    labels: Mapping[str, str] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """A Node manifest; ``server=None`` makes a client node, a string is the label value."""
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if server is not None:
        all_labels[LABEL_SERVER] = server
    annotations = {} if annotation is None else {ANNOTATION_REGISTER: annotation}
    if addresses is None:
        addresses = [] if ip is None else [{"type": "InternalIP", "address": ip}]
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": uid or f"uid-{name}",
            "labels": all_labels,
            "annotations": annotations,
        },
        "status": {"addresses": [dict(a) for a in addresses], "conditions": conditions},
    }


def _view(manifest: Mapping[str, object]) -> NodeView:
    """The ``NodeView`` of a manifest, with the test topology keys."""
    return node_view(manifest, TOPOLOGY_KEYS)


class Builders:
    """The builders above, handed to tests as one fixture (tests cannot import conftest)."""

    rack = RACK
    zone = ZONE
    keys = TOPOLOGY_KEYS
    register = staticmethod(_register)
    card = staticmethod(_card)
    node = staticmethod(_node)
    view = staticmethod(_view)


@pytest.fixture
def build() -> type[Builders]:
    """Manifest and annotation builders."""
    return Builders


@pytest.fixture
def make_settings() -> Callable[..., Settings]:
    """Settings for discovery from ``RGPU_*`` overrides (probing fast by default)."""

    def make(**overrides: str) -> Settings:
        env = {
            # Authenticated as k8s/ deploys it: the probe answers the allocator's token only.
            "RGPU_AUTH": "tokenreview",
            "RGPU_PROBE_CALLERS": ALLOCATOR,
            "RGPU_PROBE_INTERVAL_SECONDS": "0.2",
            "RGPU_PROBE_TIMEOUT_SECONDS": "0.5",
            "RGPU_TOPOLOGY_KEYS": ",".join(TOPOLOGY_KEYS),
            **overrides,
        }
        return DiscoverySettings.from_env(env)

    return make


@dataclass(frozen=True, slots=True, kw_only=True)
class Discovery:
    """A running discovery app, its HTTP client and its metrics registry."""

    client: httpx.AsyncClient
    registry: CollectorRegistry

    async def fleet(self, since: int | None = None, wait: float | None = None) -> Fleet:
        """``GET /v1/fleet`` (long-polled when ``since`` is given), decoded."""
        return Fleet.from_dict(await self._get("/v1/fleet", since, wait))

    async def topology(self, since: int | None = None, wait: float | None = None) -> Topology:
        """``GET /v1/topology`` (long-polled when ``since`` is given), decoded."""
        return Topology.from_dict(await self._get("/v1/topology", since, wait))

    async def fleet_when(self, check: Callable[[Fleet], bool], timeout: float = 5.0) -> Fleet:
        """Long-poll the fleet until ``check`` holds; fails the test after ``timeout`` s."""
        with anyio.fail_after(timeout):
            fleet = await self.fleet()
            while not check(fleet):
                fleet = await self.fleet(since=fleet.revision, wait=1.0)
        return fleet

    async def server_when(
        self, name: str, check: Callable[[Server], bool], timeout: float = 5.0
    ) -> Server:
        """Long-poll the fleet until it lists server ``name`` and ``check`` holds for it."""
        fleet = await self.fleet_when(
            lambda f: any(s.name == name and check(s) for s in f.servers), timeout
        )
        return next(s for s in fleet.servers if s.name == name)

    async def topology_when(
        self, check: Callable[[Topology], bool], timeout: float = 5.0
    ) -> Topology:
        """Long-poll the topology until ``check`` holds."""
        with anyio.fail_after(timeout):
            topology = await self.topology()
            while not check(topology):
                topology = await self.topology(since=topology.revision, wait=1.0)
        return topology

    async def reprobe(self, name: str) -> httpx.Response:
        """``POST /v1/servers/{name}/probe``, the raw response (status, headers, body)."""
        return await self.client.post(f"/v1/servers/{name}/probe")

    async def ready(self, timeout: float = 5.0) -> None:
        """Wait for ``/readyz`` to answer 200."""

        async def ready() -> bool:
            # Polling is the point here: it is how a kubelet sees readiness.
            return (await self.client.get("/readyz")).status_code == 200

        await eventually(ready, timeout=timeout, what="discovery's /readyz answering 200")

    async def counted(self, name: str, minimum: float, **labels: str) -> None:
        """Wait until counter ``name`` reaches ``minimum`` (summed over every label value when
        no ``labels`` are given); counters have no change event, so this polls."""
        await eventually(
            lambda: self._value(name, labels) >= minimum,
            timeout=5.0,
            what=f"counter {name}{labels or ''} reaching {minimum}",
        )

    def _value(self, name: str, labels: dict[str, str]) -> float:
        return self.sample(name, **labels) if labels else self.total(name)

    def sample(self, name: str, **labels: str) -> float:
        """A sample's value from the app's registry (0 when absent)."""
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def total(self, name: str) -> float:
        """The sum of every sample of counter ``name`` (all label values)."""
        return sum(
            sample.value
            for metric in self.registry.collect()
            for sample in metric.samples
            if sample.name == name
        )

    async def _get(self, path: str, since: int | None, wait: float | None) -> object:
        params = {} if since is None else {"since": str(since)}
        if wait is not None:
            params["wait"] = str(wait)
        response = await self.client.get(path, params=params)
        assert response.status_code == 200, response.text
        return orjson.loads(response.content)


@pytest.fixture
async def sim() -> AsyncIterator[SimApiServer]:
    """A fresh simulated apiserver on an ephemeral loopback port."""
    async with run_apiserver() as server:
        server.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
        for account in (ALLOCATOR_ACCOUNT, "intruder"):
            meta = {"name": account, "namespace": NAMESPACE}
            server.store.create("serviceaccounts", {"metadata": meta})
        yield server


@asynccontextmanager
async def caller(
    sim_url: str, account: str = ALLOCATOR_ACCOUNT, **source: Any
) -> AsyncIterator[BearerAuth]:
    """Tokens of ``account`` minted through TokenRequest, as the allocator gets them in the
    simulated cluster (``source`` goes to ``TokenRequestSource``: audience, by default
    discovery's, seconds)."""
    settings = Settings.from_env({"RGPU_KUBE_URL": sim_url}, service="allocator")
    source = {"audience": DISCOVERY_AUDIENCE, **source}
    async with kube_client(settings) as kube:
        yield BearerAuth(TokenRequestSource(kube, namespace=NAMESPACE, account=account, **source))


@pytest.fixture
def start(
    sim: SimApiServer, make_settings: Callable[..., Settings]
) -> Callable[..., AbstractAsyncContextManager[Discovery]]:
    """Start discovery against ``sim``: ``async with start(**RGPU_overrides) as d:``; each
    replica started gets its own identity (``discovery-1``, ``discovery-2``…) unless given."""
    started = itertools.count(1)

    @asynccontextmanager
    async def run(
        *,
        probe_dialer: Dialer = dial_tcp,
        wait_ready: bool = True,
        reprobe_min_interval: float = REPROBE_MIN_INTERVAL,
        identity: str | None = None,
        membership: MembershipTiming = FAST_MEMBERSHIP,
        writer_policy: WriterPolicy = FAST_WRITER,
        **overrides: str,
    ) -> AsyncIterator[Discovery]:
        registry = CollectorRegistry()
        settings = make_settings(RGPU_KUBE_URL=sim.url, **overrides)
        app = create_app(
            settings,
            probe_dialer=probe_dialer,
            registry=registry,
            watch_backoff=FAST_BACKOFF,
            reprobe_min_interval=reprobe_min_interval,
            identity=identity or f"discovery-{next(started)}",
            membership=membership,
            writer_policy=writer_policy,
        )
        async with (
            caller(sim.url) as auth,
            LifespanManager(app) as manager,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=manager.app),
                base_url="http://discovery",
                auth=auth,
            ) as client,
        ):
            discovery = Discovery(client=client, registry=registry)
            if wait_ready:
                await discovery.ready()
            yield discovery

    return run


@pytest.fixture
def token_caller() -> Callable[..., AbstractAsyncContextManager[BearerAuth]]:
    """``async with token_caller(sim_url, account=..., audience=..., seconds=...) as auth:``"""
    return caller
