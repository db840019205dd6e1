"""Unknown is not failure (docs/design.md#unknown-is-not-failure): a Binding whose outcome ``/bind``
cannot know keeps the pod's claim, and the allocator's own rules settle it; only a definite refusal
releases at once.

The real discovery, allocator and extender apps run in process against kubesim over HTTP. The
extender reaches kubesim through ``Relay``, a TCP relay that loses a Binding the way a network
does — held back until after the extender gave up (applied late), or cut before it left — while
every other call passes; the allocator talks to kubesim directly and runs on a fake clock, so
a booking's TTL passes without waiting for it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import httpx
import pytest
from anyio.abc import SocketStream, TaskStatus
from asgi_lifespan import LifespanManager

import rgpu_allocator
import rgpu_discovery
import rgpu_extender
from rgpu_allocator.settings import AllocatorSettings
from rgpu_discovery.settings import DiscoverySettings
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_testkit import node_manifest, register_annotation, register_card

pytestmark = pytest.mark.anyio

Load = Callable[[str], Any]
TTL = 30.0
BUDGET = "0.5"
_LOST = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


class Relay:
    """A loopback TCP relay to kubesim's apiserver that passes every call but a Binding.

    ``mode`` says what happens to a connection carrying ``pods/<name>/binding``: ``pass``
    relays it, ``drop`` closes it before the request reaches the apiserver, ``late`` holds the
    request back until ``let_through`` and then delivers it (the extender has long given up by
    then) and throws the answer away.
    """

    def __init__(self, upstream: httpx.URL) -> None:
        self.upstream = upstream
        self.mode: Literal["pass", "drop", "late"] = "pass"
        self.port = 0
        self.released = anyio.Event()
        self.delivered = anyio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def let_through(self) -> None:
        self.released.set()

    async def serve(self, *, task_status: TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started()
        async with listener:
            await listener.serve(self._connection)

    async def _connection(self, client: SocketStream) -> None:
        host, port = self.upstream.host, self.upstream.port or 80
        async with client, await anyio.connect_tcp(host, port) as upstream:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._answers, upstream, client)
                late = await self._requests(client, upstream)
                tg.cancel_scope.cancel()
            if late:
                await self._deliver_late(upstream, late)

    async def _requests(self, client: SocketStream, upstream: SocketStream) -> bytes:
        """Relay requests; returns a Binding to deliver late, empty when there is none."""
        try:
            async for chunk in client:
                if b"/binding " in chunk and self.mode != "pass":
                    return await _whole(client, chunk) if self.mode == "late" else b""
                await upstream.send(chunk)
        except _LOST:
            pass
        return b""

    async def _deliver_late(self, upstream: SocketStream, request: bytes) -> None:
        await self.released.wait()
        self.mode = "pass"
        with contextlib.suppress(*_LOST):
            await upstream.send(request)
            await upstream.receive()
        self.delivered.set()

    @staticmethod
    async def _answers(upstream: SocketStream, client: SocketStream) -> None:
        with contextlib.suppress(*_LOST):
            async for chunk in upstream:
                await client.send(chunk)


async def _whole(client: SocketStream, data: bytes) -> bytes:
    """The whole HTTP request that ``data`` begins (headers and its Content-Length body)."""
    while b"\r\n\r\n" not in data:
        data += await client.receive()
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
    size = int(lengths[0].partition(b":")[2]) if lengths else 0
    while len(body) < size:
        body += await client.receive()
    return head + b"\r\n\r\n" + body


@dataclass
class FakeClock:
    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cluster:
    sim: SimApiServer
    relay: Relay
    clock: FakeClock
    extender: httpx.AsyncClient
    allocator: httpx.AsyncClient
    args: dict[str, Any]

    def pod(self, name: str) -> dict[str, Any]:
        pod = copy.deepcopy(self.args["Pod"])
        meta = pod["metadata"]
        pod["metadata"] = {k: v for k, v in meta.items() if k in ("labels", "annotations")}
        pod["metadata"]["name"] = name
        pod.pop("status")
        return self.sim.store.create("pods", pod, namespace="ml-team")

    def stored(self, name: str) -> dict[str, Any]:
        return dict(self.sim.store.get("pods", name, namespace="ml-team"))

    async def filter(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Filter like kube-scheduler: an ``Error`` (inventory still syncing) means retry."""
        with anyio.fail_after(5):
            while True:
                reply = (await self.extender.post("/filter", json={**self.args, "Pod": pod})).json()
                if not reply["Error"]:
                    return dict(reply)
                await anyio.sleep(0.02)

    async def fits(self, pod: dict[str, Any]) -> bool:
        return bool((await self.filter(pod))["NodeNames"])

    async def bind(self, pod: dict[str, Any]) -> str:
        meta = pod["metadata"]
        args = {
            "PodName": meta["name"],
            "PodNamespace": "ml-team",
            "PodUID": meta["uid"],
            "Node": "gpu-node-1",
        }
        reply = (await self.extender.post("/bind", json=args)).json()
        return str(reply["Error"])

    async def claim_status(self, pod: dict[str, Any]) -> int:
        return (await self.allocator.get(f"/v1/allocations/{pod['metadata']['uid']}")).status_code


def _node(name: str, *, server: bool) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "topology.rgpu.io/rack": "r1"}
    annotations = {}
    if server:
        labels["hami.io/lupine-server"] = "14833"
        cards = (register_card(uuid=f"GPU-{name}-{i}", index=i) for i in range(2))
        annotations["hami.io/node-nvidia-register"] = register_annotation(cards)
    return node_manifest(name=name, labels=labels, annotations=annotations, address="127.0.0.2")


@pytest.fixture
async def cluster(load_fixture: Load) -> AsyncIterator[Cluster]:
    async with run_apiserver() as sim, anyio.create_task_group() as tg:
        for namespace in ("ml-team", "rgpu-system"):
            sim.store.create("namespaces", {"metadata": {"name": namespace}})
        for name, server in (("gpu-node-1", False), ("gpu-node-2", True), ("cpu-node-1", False)):
            sim.store.create("nodes", _node(name, server=server))
        relay = Relay(httpx.URL(sim.url))
        await tg.start(relay.serve)
        clock = FakeClock()
        async with _serving(sim, relay, clock) as (extender, allocator):
            yield Cluster(
                sim=sim,
                relay=relay,
                clock=clock,
                extender=extender,
                allocator=allocator,
                args=load_fixture("k8s/extender-filter-args.json"),
            )
        tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _serving(
    sim: SimApiServer, relay: Relay, clock: FakeClock
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    # Authenticated as k8s/ deploys it: each service mints its own token.
    env = {
        "RGPU_KUBE_URL": sim.url,
        "RGPU_LOG_FORMAT": "text",
        "RGPU_BOOKING_TTL_SECONDS": f"{TTL:g}",
        "RGPU_AUTH": "tokenreview",
        "RGPU_ALLOCATION_CALLERS": "system:serviceaccount:rgpu-system:rgpu-extender",
    }
    for account in ("rgpu-allocator", "rgpu-extender"):
        meta = {"name": account, "namespace": "rgpu-system"}
        sim.store.create("serviceaccounts", {"metadata": meta})
    discovery = rgpu_discovery.create_app(DiscoverySettings.from_env(env))
    async with LifespanManager(discovery) as d:
        to_discovery = httpx.ASGITransport(app=d.app)
        allocator = rgpu_allocator.create_app(
            AllocatorSettings.from_env({**env, "RGPU_TOKEN_ACCOUNT": "rgpu-allocator"}),
            discovery_transport=to_discovery,
            clock=clock,
        )
        async with LifespanManager(allocator) as a:
            to_allocator = httpx.ASGITransport(app=a.app)
            extender_env = {
                **env,
                "RGPU_KUBE_URL": relay.url,
                "RGPU_EXTENDER_BUDGET_SECONDS": BUDGET,
                "RGPU_TOKEN_ACCOUNT": "rgpu-extender",
            }
            extender = rgpu_extender.create_app(
                ExtenderSettings.from_env(extender_env),
                allocator_transport=to_allocator,
                discovery_transport=to_discovery,
            )
            async with (
                LifespanManager(extender) as e,
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=e.app), base_url="http://ext"
                ) as ext,
                httpx.AsyncClient(transport=to_allocator, base_url="http://alloc") as alloc,
            ):
                yield ext, alloc


async def test_binding_applied_after_the_extender_gave_up_keeps_the_claim_and_the_server(
    cluster: Cluster,
) -> None:
    first, second = cluster.pod("trainer-0"), cluster.pod("trainer-1")
    assert await cluster.fits(first)

    cluster.relay.mode = "late"
    error = await cluster.bind(first)
    assert "did not finish within the 0.5s budget" in error
    assert "claim is kept" in error
    assert not cluster.stored("trainer-0")["spec"].get("nodeName")

    cluster.relay.let_through()
    with anyio.fail_after(10):  # a hang guard, not a speed bound: the suite runs loaded
        await cluster.relay.delivered.wait()
    assert cluster.stored("trainer-0")["spec"]["nodeName"] == "gpu-node-1"
    assert await cluster.claim_status(first) == 200
    assert not await cluster.fits(second)

    cluster.clock.now += TTL + 1
    assert not await cluster.fits(second)
    assert await cluster.claim_status(first) == 200


async def test_retried_bind_of_a_pod_bound_by_a_late_binding_is_success(
    cluster: Cluster,
) -> None:
    first = cluster.pod("trainer-0")
    assert await cluster.fits(first)
    cluster.relay.mode = "late"
    assert await cluster.bind(first) != ""
    cluster.relay.let_through()
    with anyio.fail_after(10):  # a hang guard, not a speed bound: the suite runs loaded
        await cluster.relay.delivered.wait()

    assert await cluster.bind(first) == ""
    assert await cluster.claim_status(first) == 200


async def test_binding_dropped_before_the_apiserver_keeps_the_claim_until_its_booking_lapses(
    cluster: Cluster,
) -> None:
    first, second = cluster.pod("trainer-0"), cluster.pod("trainer-1")
    assert await cluster.fits(first)

    cluster.relay.mode = "drop"
    error = await cluster.bind(first)
    assert "no answer from the apiserver" in error
    assert "claim is kept" in error
    assert not cluster.stored("trainer-0")["spec"].get("nodeName")
    assert await cluster.claim_status(first) == 200
    assert not await cluster.fits(second)

    cluster.clock.now += TTL + 1
    assert await cluster.fits(second)
    assert await cluster.claim_status(first) == 404


@pytest.mark.parametrize("code", [404, 422])
async def test_binding_refused_by_the_apiserver_releases_the_claim_at_once(
    cluster: Cluster, code: int
) -> None:
    first, second = cluster.pod("trainer-0"), cluster.pod("trainer-1")
    assert await cluster.fits(first)

    cluster.sim.faults.set_error(verb="create", resource="pods/binding", rate=1.0, code=code)
    error = await cluster.bind(first)
    assert f"{code}" in error
    assert "claim is kept" not in error
    assert await cluster.claim_status(first) == 404
    assert await cluster.fits(second)


async def test_binding_of_a_deleted_pod_releases_the_claim_at_once(cluster: Cluster) -> None:
    first = cluster.pod("trainer-0")
    assert await cluster.fits(first)
    cluster.sim.store.delete("pods", "trainer-0", namespace="ml-team")

    error = await cluster.bind(first)
    assert "404" in error
    assert await cluster.claim_status(first) == 404
