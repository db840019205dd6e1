"""Removals judged again on the Lease they write (docs/design.md §10): a commit that lands between a
replica's look and its write survives; terminating pods keep their server; no claim is dropped on a
stale pod cache.

Replica A is the real app with a fake clock; replica B is the same activities built on their
own (real apiserver client against kubesim, their own caches, a clock a little later), so
each step of the race happens in a chosen order.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

from rgpu_allocator import create_app
from rgpu_allocator.claims import MANAGED_BY_SELECTOR, encode_lease
from rgpu_allocator.clients import COMPONENT, KubeApi
from rgpu_allocator.instruments import Instruments
from rgpu_allocator.judging import Judge
from rgpu_allocator.leases import LeaseWriter
from rgpu_allocator.ledger import Ledger
from rgpu_allocator.pods import PodIndex, pod_info
from rgpu_allocator.policy import Policy
from rgpu_allocator.removal import Remover
from rgpu_allocator.repair import Repairer
from rgpu_allocator.revalidation import Revalidator
from rgpu_allocator.sweeping import Reconciler, Sweeper
from rgpu_allocator.waiters import Refused
from rgpu_contracts import Claim, ClaimState, ServerName
from rgpu_placement import FleetView, Validity
from rgpu_runtime.feeds import DiscoveryMirror
from rgpu_runtime.kube import EventRecorder, kube_client
from rgpu_runtime.settings import ResourceSettings

pytestmark = pytest.mark.anyio

TTL = 30.0
T0 = 1_800_000_000.0
SERVER = "gpu-a"


@dataclasses.dataclass
class FakeClock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


class HookedApi(KubeApi):
    """The real apiserver calls; ``after_pod_read`` runs between a fresh pod read and its use,
    which is where another replica's commit lands in the race."""

    after_pod_read: Callable[[], Awaitable[None]] | None = None

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        raw = await super().get_pod(namespace, name)
        hook, self.after_pod_read = self.after_pod_read, None
        if hook is not None:
            await hook()
        return raw


@dataclasses.dataclass
class ReplicaB:
    api: HookedApi
    judge: Judge
    writer: LeaseWriter
    remover: Remover
    registry: CollectorRegistry

    def revalidator(self) -> Revalidator:
        return Revalidator(self.judge, self.api, self.writer, self.remover)

    def sweeper(self) -> Sweeper:
        policy = Policy(granularity="server", ttl=TTL, scheduler_name="rgpu", namespace="x")
        instruments = Instruments(
            CollectorRegistry(),
            ledger=Ledger(),
            pods=PodIndex(),
            discovery=DiscoveryMirror(FleetView.build, topology_keys=()),
        )
        repairer = Repairer(
            policy, self.judge, self.writer, self.api, instruments, resources=ResourceSettings()
        )
        reconciler = Reconciler(self.judge, self.writer, self.remover, repairer, Refused())
        return Sweeper(self.judge, self.api, self.remover, reconciler, repairer)

    def removed(self, reason: str) -> float:
        sample = self.registry.get_sample_value(
            "rgpu_allocator_sweep_removals_total", {"reason": reason}
        )
        return sample or 0.0


@contextlib.asynccontextmanager
async def replica_a(kit, sim, discovery, clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    settings = kit.settings_for(sim.url, RGPU_BOOKING_TTL_SECONDS=str(int(TTL)))
    app = create_app(
        settings, discovery_transport=httpx.MockTransport(discovery.handler), clock=clock
    )
    async with (
        kit.caller(sim.url) as auth,
        LifespanManager(app, startup_timeout=20, shutdown_timeout=20) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://allocator", auth=auth
        ) as client,
    ):
        await kit.wait_fleet(client)
        yield client


@contextlib.asynccontextmanager
async def replica_b(kit, sim, clock: FakeClock, *, trusted: bool = True) -> AsyncIterator[ReplicaB]:
    settings = kit.settings_for(sim.url)
    events = EventRecorder(component=COMPONENT)
    async with kube_client(settings) as kube, contextlib.AsyncExitStack() as stack:
        stack.callback(events.close)
        api = HookedApi(
            kube, namespace="rgpu-system", lease_selector=MANAGED_BY_SELECTOR, events=events
        )
        ledger, pods = Ledger(), PodIndex()
        discovery = DiscoveryMirror(FleetView.build, topology_keys=())
        registry = CollectorRegistry()
        instruments = Instruments(registry, ledger=ledger, pods=pods, discovery=discovery)
        judge = Judge(
            ledger=ledger,
            pods=pods,
            discovery=discovery,
            ttl=TTL,
            clock=clock,
            pods_trusted=lambda: trusted,
        )
        writer = LeaseWriter(api, ledger, instruments, on_freed=lambda: None)
        yield ReplicaB(
            api=api,
            judge=judge,
            writer=writer,
            remover=Remover(judge, writer, instruments),
            registry=registry,
        )


def cache_pod(sim, b: ReplicaB, pod, **changes: Any) -> None:
    """Put the pod into B's cache as the apiserver holds it now, with ``changes`` applied."""
    raw = sim.store.get("pods", pod.name, namespace=pod.namespace)
    raw["metadata"].update(changes.pop("metadata", {}))
    raw["spec"].update(changes.pop("spec", {}))
    raw.setdefault("status", {}).update(changes.pop("status", {}))
    info = pod_info(raw)
    assert info is not None
    b.judge.pods.put(info)


def states(cluster) -> dict[str, str]:
    return {c["pod"]["name"]: c["state"] for c in cluster.claims(SERVER)}


async def book_then_commit_late(
    kit, client, pod, a_clock: FakeClock
) -> Callable[[], Awaitable[None]]:
    """Book ``pod`` at T0; return the commit that lands just inside the TTL."""
    booked = await client.post("/v1/allocations", json=kit.ask(pod))
    assert booked.status_code == 200

    async def commit() -> None:
        a_clock.now = T0 + TTL - 1
        answer = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "client-1"})
        assert answer.status_code == 200, answer.text

    return commit


async def test_commit_landing_after_revalidation_judged_the_booking_expired_survives(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server(SERVER)))
    pod, other = cluster.pod("late"), cluster.pod("other")
    a_clock, b_clock = FakeClock(), FakeClock(T0 + TTL + 1)
    async with (
        replica_a(kit, sim, discovery, a_clock) as client,
        replica_b(kit, sim, b_clock) as b,
    ):
        commit = await book_then_commit_late(kit, client, pod, a_clock)
        # B re-reads the Lease, reads the pod fresh (unbound, booked TTL + 1 s ago by B's
        # clock: invalid), and only then does A's commit land.
        b.api.after_pod_read = commit
        await b.revalidator().revalidate([SERVER])
        assert states(cluster) == {"late": "committed"}
        refused = await client.post("/v1/allocations", json=kit.ask(other))
    assert refused.status_code == 409
    assert b.removed("expired") == 0


async def test_commit_landing_after_the_sweep_judged_the_booking_expired_survives(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server(SERVER)))
    pod, other = cluster.pod("late"), cluster.pod("other")
    a_clock, b_clock = FakeClock(), FakeClock(T0 + TTL + 1)
    async with (
        replica_a(kit, sim, discovery, a_clock) as client,
        replica_b(kit, sim, b_clock) as b,
    ):
        commit = await book_then_commit_late(kit, client, pod, a_clock)
        await b.writer.reread(SERVER)
        # B's cache does not know the pod: the sweep reads it fresh, then the commit lands.
        b.api.after_pod_read = commit
        await b.sweeper().sweep_once()
        assert states(cluster) == {"late": "committed"}
        refused = await client.post("/v1/allocations", json=kit.ask(other))
    assert refused.status_code == 409


async def test_commit_landing_after_a_cached_verdict_of_expired_survives_the_removal(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server(SERVER)))
    pod = cluster.pod("late")
    a_clock, b_clock = FakeClock(), FakeClock(T0 + TTL + 1)
    async with (
        replica_a(kit, sim, discovery, a_clock) as client,
        replica_b(kit, sim, b_clock) as b,
    ):
        commit = await book_then_commit_late(kit, client, pod, a_clock)
        record = await b.writer.reread(SERVER)
        cache_pod(sim, b, pod)
        assert record is not None
        assert b.judge.validity(record.claims[0]) is Validity.INVALID
        await commit()
        removed = await b.remover.drop_invalid(SERVER)
    assert removed == 0
    assert states(cluster) == {"late": "committed"}


async def test_a_commit_is_judged_on_its_commit_time_not_its_booking_time(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server(SERVER)))
    pod = cluster.pod("late")
    a_clock, b_clock = FakeClock(), FakeClock(T0 + TTL + TTL - 2)
    async with (
        replica_a(kit, sim, discovery, a_clock) as client,
        replica_b(kit, sim, b_clock) as b,
    ):
        commit = await book_then_commit_late(kit, client, pod, a_clock)
        await commit()
        cache_pod(sim, b, pod)
        await b.writer.reread(SERVER)
        kept = await b.remover.drop_invalid(SERVER)
        b_clock.now = T0 + TTL - 1 + TTL
        lapsed = await b.remover.drop_invalid(SERVER)
    assert (kept, lapsed) == (0, 1)


def write_lease(sim, cluster, server: str, *claims: Claim) -> None:
    """Store ``claims`` in ``server``'s Lease as another replica would."""
    found = cluster.lease(server)
    version = found["metadata"]["resourceVersion"] if found is not None else None
    body = encode_lease(
        server=server, namespace="rgpu-system", claims=claims, resource_version=version
    )
    if found is not None:
        sim.store.replace("leases", body, namespace="rgpu-system")
    else:
        sim.store.create("leases", body, namespace="rgpu-system")


async def test_settling_duplicates_keeps_a_claim_committed_since_they_were_judged(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server(SERVER), build.server("gpu-b")))
    pod = cluster.pod("twice")
    async with replica_a(kit, sim, discovery, FakeClock()) as client:
        await client.post("/v1/allocations", json=kit.ask(pod))
    booked = Claim.from_dict(cluster.claims(SERVER)[0])
    # A racing replica booked the same pod on the other server.
    twin = dataclasses.replace(booked, server=ServerName("gpu-b"), cards=())
    write_lease(sim, cluster, "gpu-b", twin)
    async with replica_b(kit, sim, FakeClock(T0 + TTL + 1)) as b:
        for server in (SERVER, "gpu-b"):
            await b.writer.reread(server)
        cache_pod(sim, b, pod)
        # B finds both bookings expired; another replica's commit lands before B writes.
        committed = dataclasses.replace(
            booked, state=ClaimState.COMMITTED, committed_at=T0 + TTL - 1
        )
        write_lease(sim, cluster, SERVER, committed)
        await b.remover.settle(pod.uid)
    assert cluster.holders() == {SERVER: ["twice"], "gpu-b": []}
    assert states(cluster) == {"twice": "committed"}


async def test_a_booking_that_expired_before_its_commit_is_refused(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server(SERVER)))
    pod = cluster.pod("late")
    a_clock = FakeClock()
    async with replica_a(kit, sim, discovery, a_clock) as client:
        await client.post("/v1/allocations", json=kit.ask(pod))
        a_clock.now = T0 + TTL
        answer = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "n"})
    assert (answer.status_code, answer.json()["code"]) == (409, "booking_expired")
    assert states(cluster) == {"late": "booked"}


async def test_a_terminating_pod_keeps_its_server_until_the_object_is_gone(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server(SERVER)))
    pod = cluster.pod("stopping")
    a_clock = FakeClock()
    async with replica_a(kit, sim, discovery, a_clock) as client:
        commit = await book_then_commit_late(kit, client, pod, a_clock)
        await commit()
    cluster.bind(pod)
    async with replica_b(kit, sim, FakeClock(T0 + 10 * TTL)) as b:
        await b.writer.reread(SERVER)
        # Kubernetes marks a deleted pod terminating while its containers still run.
        terminating = {"deletionTimestamp": "2027-01-15T08:00:00Z"}
        cache_pod(sim, b, pod, metadata=terminating)
        kept = await b.remover.drop_invalid(SERVER)
        await b.sweeper().sweep_once()
        held = states(cluster)
        cluster.delete(pod)
        b.judge.pods.remove(pod.uid)
        dropped = await b.remover.drop_invalid(SERVER)
    assert (kept, held, dropped) == (0, {"stopping": "committed"}, 1)
    assert b.removed("deleted") == 1


async def test_a_stale_pod_cache_drops_no_claim_and_a_fresh_read_decides(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server(SERVER), build.server("gpu-b")))
    running, gone = cluster.pod("running"), cluster.pod("gone")
    async with replica_a(kit, sim, discovery, FakeClock()) as client:
        for pod in (running, gone):
            await client.post("/v1/allocations", json=kit.ask(pod))
    async with replica_b(kit, sim, FakeClock(T0 + TTL + 1), trusted=False) as b:
        # B's silent watch missed that one pod got bound and the other deleted.
        cache_pod(sim, b, running)
        cache_pod(sim, b, gone)
        cluster.bind(running)
        cluster.delete(gone)
        for server in (SERVER, "gpu-b"):
            await b.writer.reread(server)
        on_cache = [await b.remover.drop_invalid(s) for s in (SERVER, "gpu-b")]
        await b.sweeper().sweep_once()
    assert on_cache == [0, 0]
    assert sorted(n for names in cluster.holders().values() for n in names) == ["running"]
    assert b.removed("deleted") == 1
