"""Several allocator replicas on one apiserver: every replica decides, only the elected one
writes on its own initiative (reconcile, sweep, repair, nudge), so background writes do not
grow with the replica count; when the leader stops or dies another takes over and sweeps what
it left. Real apps on kubesim over HTTP; writes counted at the apiserver's request meter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client.parser import text_string_to_metric_families

from rgpu_allocator import create_app
from rgpu_allocator.app import LEADER_LEASE
from rgpu_runtime.replicas import ElectionTiming

pytestmark = pytest.mark.anyio

WRITES = frozenset({"create", "update", "patch", "delete"})
QUIET = ElectionTiming(lease_seconds=30, renew_deadline_seconds=20, retry_seconds=10)
"""No renewal inside a test's window: every write counted is background work."""
BRISK = ElectionTiming(lease_seconds=2, renew_deadline_seconds=1.5, retry_seconds=0.2)
"""A dead leader is replaced within about two seconds."""


def writes(sim: Any, resource: str) -> int:
    """Write requests rgpu-allocator sent for ``resource`` (refused ones too)."""
    return sum(
        count.requests
        for key, count in sim.meter.snapshot().items()
        if key.client == "rgpu-allocator" and key.verb in WRITES and key.resource == resource
    )


async def leads(client: httpx.AsyncClient) -> bool:
    text = (await client.get("/metrics")).text
    return any(
        sample.value == 1
        for family in text_string_to_metric_families(text)
        if family.name == "rgpu_leader"
        for sample in family.samples
    )


@asynccontextmanager
async def replicas(
    kit: Any,
    sim: Any,
    discovery: Any,
    count: int,
    *,
    timing: ElectionTiming = QUIET,
    kube_urls: Mapping[int, str] | None = None,
    **env: str,
) -> AsyncIterator[list[httpx.AsyncClient]]:
    """``count`` allocator apps on one kubesim, each answering over ASGI; yields once every
    one holds the fleet. ``kube_urls`` sends a replica's apiserver calls elsewhere."""
    async with AsyncExitStack() as stack:
        auth = await stack.enter_async_context(kit.caller(sim.url))
        clients = []
        for n in range(count):
            url = (kube_urls or {}).get(n, sim.url)
            app = create_app(
                kit.settings_for(url, **env),
                discovery_transport=discovery.transport,
                election=timing,
            )
            manager = await stack.enter_async_context(
                LifespanManager(app, startup_timeout=20, shutdown_timeout=20)
            )
            client = await stack.enter_async_context(
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=manager.app),
                    base_url=f"http://allocator-{n}",
                    auth=auth,
                )
            )
            await kit.wait_fleet(client)
            clients.append(client)
        yield clients


async def leaders(clients: list[httpx.AsyncClient]) -> list[int]:
    return [n for n, client in enumerate(clients) if await leads(client)]


@pytest.mark.parametrize("count", [2, 3])
async def test_exactly_one_replica_leads_and_every_replica_decides(build, kit, sim, cluster, count):
    discovery = kit.FakeDiscovery(build.fleet(*(build.server(f"gpu-{i}") for i in range(count))))
    async with replicas(kit, sim, discovery, count) as clients:
        assert await leaders(clients) == [0]
        for n, client in enumerate(clients):
            answer = await client.post("/v1/allocations", json=kit.ask(cluster.pod(f"p{n}")))
            assert answer.status_code == 200, answer.text
        assert (await clients[-1].get("/readyz")).status_code == 200


@pytest.mark.parametrize("count", [1, 2, 3])
async def test_a_deleted_holders_claim_is_dropped_by_one_write_whatever_the_replica_count(
    build, kit, sim, cluster, count
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with replicas(kit, sim, discovery, count) as clients:
        pod = cluster.pod("holder")
        answer = await clients[-1].post("/v1/allocations", json=kit.ask(pod))
        assert answer.status_code == 200, answer.text
        before = writes(sim, "leases")
        cluster.delete(pod)
        await kit.wait_for(lambda: not cluster.claims("gpu-a"), what="the claim dropped")
        await anyio.sleep(0.3)  # room for a second replica's write, were there one
        assert writes(sim, "leases") - before == 1


@pytest.mark.parametrize("count", [1, 3])
async def test_a_lapsed_booking_is_swept_by_one_write_whatever_the_replica_count(
    build, kit, sim, cluster, count
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with replicas(kit, sim, discovery, count, RGPU_BOOKING_TTL_SECONDS="1") as clients:
        answer = await clients[-1].post("/v1/allocations", json=kit.ask(cluster.pod("late")))
        assert answer.status_code == 200, answer.text
        before = writes(sim, "leases")
        await kit.wait_for(lambda: not cluster.claims("gpu-a"), what="the booking swept")
        await anyio.sleep(0.7)  # two more sweep intervals
        assert writes(sim, "leases") - before == 1


async def test_the_leader_nudges_a_pod_a_follower_refused_and_nobody_else_nudges(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with replicas(kit, sim, discovery, 3) as clients:
        holder, parked = cluster.pod("holder"), cluster.pod("parked")
        assert (await clients[1].post("/v1/allocations", json=kit.ask(holder))).status_code == 200
        refused = await clients[2].post("/v1/allocations", json=kit.ask(parked))
        assert refused.status_code == 409, refused.text
        before = writes(sim, "pods")
        cluster.delete(holder)
        await kit.wait_for(
            lambda: "rgpu.io/retry-at" in cluster.annotations(parked), what="the parked pod nudged"
        )
        await anyio.sleep(0.3)
        assert writes(sim, "pods") - before == 1


@asynccontextmanager
async def cuttable_proxy(target: str) -> AsyncIterator[tuple[str, Callable[[], None]]]:
    """A TCP forwarder to ``target`` (host:port URL); the callable cuts every connection
    and refuses new ones, as a dead pod's network would."""
    host, port = target.removeprefix("http://").rsplit(":", 1)
    cut = anyio.Event()

    async def pipe(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
        try:
            async for chunk in src:
                await dst.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            await dst.aclose()

    async def serve(client: anyio.abc.SocketStream) -> None:
        async with (
            client,
            await anyio.connect_tcp(host, int(port)) as upstream,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(pipe, client, upstream)
            tg.start_soon(pipe, upstream, client)
            await cut.wait()
            tg.cancel_scope.cancel()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    url = f"http://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
    async with anyio.create_task_group() as tg:

        def kill() -> None:
            cut.set()
            tg.cancel_scope.cancel()

        tg.start_soon(listener.serve, serve)
        yield url, kill
        tg.cancel_scope.cancel()
    await listener.aclose()


async def test_a_dead_leader_is_replaced_and_the_new_leader_sweeps_what_it_left(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with (
        cuttable_proxy(sim.url) as (proxied, kill),
        replicas(kit, sim, discovery, 2, timing=BRISK, kube_urls={0: proxied}) as clients,
    ):
        leader, follower = clients
        assert await leads(leader)
        kill()
        pod = cluster.pod("orphan")
        assert (await follower.post("/v1/allocations", json=kit.ask(pod))).status_code == 200
        cluster.delete(pod)  # nobody reconciles: the leader is dead, the follower follows

        async def taken_over() -> bool:
            return await leads(follower)

        await kit.wait_for(taken_over, what="the follower took the lease over")
        await kit.wait_for(lambda: not cluster.claims("gpu-a"), what="the orphan swept")
        holder = sim.store.get("leases", LEADER_LEASE, namespace="rgpu-system")["spec"]
        assert holder["leaseTransitions"] == 1


async def test_a_stopping_leader_releases_and_a_follower_takes_over_long_before_expiry(
    build, kit, sim
):
    # A 30 s lease, tried every 0.2 s: only a release explains a handover within the test.
    patient = ElectionTiming(lease_seconds=30, renew_deadline_seconds=20, retry_seconds=0.2)
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a")))
    async with AsyncExitStack() as stack:
        first_stack = AsyncExitStack()
        (first,) = await first_stack.enter_async_context(
            replicas(kit, sim, discovery, 1, timing=patient)
        )
        (second,) = await stack.enter_async_context(
            replicas(kit, sim, discovery, 1, timing=patient)
        )
        assert await leads(first)
        assert not await leads(second)
        await first_stack.aclose()

        async def taken_over() -> bool:
            return await leads(second)

        # Within 20 s, below the 30 s lease (a loaded machine took more than 10 s once); the
        # poll renders /metrics on the replicas' own loop, so it is not done every 10 ms.
        with anyio.fail_after(20):
            await kit.wait_for(
                taken_over, timeout=20, interval=0.2, what="the follower took the released lease"
            )
