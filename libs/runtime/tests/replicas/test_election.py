"""Leader election through one Lease: exactly one holder, renewals by compare-and-swap, a
handover when the holder stops renewing (expiry, timed on the followers' own clocks) or stops
(release), against the simulated apiserver over real HTTP with clocks moved by hand."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest

from rgpu_runtime.errors import KubeUnavailable, SettingsError
from rgpu_runtime.kube import KubeClient, kube_client
from rgpu_runtime.replicas import Election, ElectionTiming
from rgpu_runtime.serving import Readiness
from rgpu_runtime.settings import Settings
from rgpu_testkit import eventually

kubesim = pytest.importorskip("rgpu_kubesim")

pytestmark = pytest.mark.anyio

NAMESPACE = "rgpu-system"
LEASE = "rgpu-test-leader"
TIMING = ElectionTiming(lease_seconds=15, renew_deadline_seconds=10, retry_seconds=2)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def sim() -> AsyncIterator[Any]:
    async with kubesim.run_apiserver() as server:
        server.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
        yield server


@asynccontextmanager
async def clients(url: str, count: int) -> AsyncIterator[list[KubeClient]]:
    settings = Settings.from_env({"RGPU_KUBE_URL": url}, service="allocator")
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(kube_client(settings)) for _ in range(count)]


def elections(kubes: list[KubeClient], clock: Clock) -> list[Election]:
    return [
        Election(
            kube,
            name=LEASE,
            namespace=NAMESPACE,
            identity=f"replica-{n}",
            timing=TIMING,
            clock=clock,
        )
        for n, kube in enumerate(kubes)
    ]


def spec(sim: Any) -> dict[str, Any]:
    return dict(sim.store.get("leases", LEASE, namespace=NAMESPACE)["spec"])


async def test_the_first_replica_takes_the_lease_and_the_others_follow(sim) -> None:
    clock = Clock()
    async with clients(sim.url, 3) as kubes:
        replicas = elections(kubes, clock)
        assert [await e.step() for e in replicas] == [True, False, False]
        assert [e.is_leader for e in replicas] == [True, False, False]
        assert {e.holder for e in replicas} == {"replica-0"}
    written = spec(sim)
    assert written["holderIdentity"] == "replica-0"
    assert written["leaseDurationSeconds"] == 15
    assert written["leaseTransitions"] == 0


async def test_the_holder_renews_and_nobody_takes_a_lease_that_keeps_changing(sim) -> None:
    clock = Clock()
    async with clients(sim.url, 2) as kubes:
        holder, other = elections(kubes, clock)
        await holder.step()
        for _ in range(20):  # 40 s: far past one lease, but renewed every 2 s
            clock.now += 2
            assert await holder.step()
            assert not await other.step()
    assert spec(sim)["holderIdentity"] == "replica-0"
    assert spec(sim)["leaseTransitions"] == 0


async def test_a_dead_holder_is_replaced_once_the_lease_expires_on_the_followers_clock(
    sim,
) -> None:
    clock = Clock()
    async with clients(sim.url, 3) as kubes:
        dead, *others = elections(kubes, clock)
        await dead.step()
        assert [await e.step() for e in others] == [False, False]
        clock.now += 14.9  # the holder stopped renewing: not yet a lease since last seen
        assert [await e.step() for e in others] == [False, False]
        clock.now += 0.2
        assert [await e.step() for e in others] == [True, False]
        assert others[1].holder == "replica-1"
    assert spec(sim)["holderIdentity"] == "replica-1"
    assert spec(sim)["leaseTransitions"] == 1


async def test_a_holder_that_cannot_renew_steps_down_at_its_renew_deadline(sim) -> None:
    clock = Clock()
    settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="allocator")
    async with kube_client(settings, timeout=2) as kube:
        election = Election(kube, name=LEASE, namespace=NAMESPACE, timing=TIMING, clock=clock)
        assert await election.step()
        sim.faults.set_error(resource="leases", rate=1.0, code=503)
        clock.now += 9.0
        with pytest.raises(KubeUnavailable):
            await election.step()
        assert election.is_leader  # still within the renew deadline
        clock.now += 1.0
        with pytest.raises(KubeUnavailable):
            await election.step()
        assert not election.is_leader


async def test_a_stopping_holder_releases_and_the_next_reader_takes_over_at_once(sim) -> None:
    clock = Clock()
    async with clients(sim.url, 2) as kubes:
        holder, other = elections(kubes, clock)
        await holder.step()
        await other.step()
        await holder.release()
        assert not holder.is_leader
        assert spec(sim)["holderIdentity"] == ""
        clock.now += 0.1
        assert await other.step()
    assert spec(sim)["holderIdentity"] == "replica-1"


async def test_two_replicas_racing_for_a_free_lease_elect_exactly_one(sim) -> None:
    clock = Clock()
    async with clients(sim.url, 4) as kubes:
        replicas = elections(kubes, clock)
        results: dict[str, bool] = {}

        async def race(e: Election) -> None:
            results[e.identity] = await e.step()

        async with anyio.create_task_group() as tg:
            for e in replicas:
                tg.start_soon(race, e)
        assert sum(results.values()) == 1
        assert [e.identity for e in replicas if e.is_leader] == [spec(sim)["holderIdentity"]]


async def test_listeners_and_waiters_hear_of_leading_and_of_losing_it(sim) -> None:
    clock = Clock()
    heard: list[bool] = []
    async with clients(sim.url, 1) as (kube,):
        (election,) = elections([kube], clock)
        election.subscribe(heard.append)
        async with anyio.create_task_group() as tg:
            tg.start_soon(election.until_leading)
            await election.step()
        await election.release()
    assert heard == [True, False]


async def test_run_leads_before_it_reports_started_and_releases_when_cancelled(sim) -> None:
    async with clients(sim.url, 1) as (kube,):
        election = Election(kube, name=LEASE, namespace=NAMESPACE, identity="solo", timing=TIMING)
        async with anyio.create_task_group() as tg:
            await tg.start(election.run)
            assert election.is_leader
            tg.cancel_scope.cancel()
    assert not election.is_leader
    assert spec(sim)["holderIdentity"] == ""


def test_a_timing_that_would_let_two_lead_at_once_is_refused() -> None:
    with pytest.raises(SettingsError, match="renew deadline"):
        ElectionTiming(lease_seconds=10, renew_deadline_seconds=12, retry_seconds=2)


async def test_an_election_that_cannot_be_held_blocks_readiness_until_it_can() -> None:
    """Run alone against an apiserver without the system namespace: every try is a 404, and
    the replica must not report ready meanwhile (it leads nothing, sweeps nothing)."""
    readiness = Readiness()
    fast = ElectionTiming(lease_seconds=0.5, renew_deadline_seconds=0.3, retry_seconds=0.05)
    async with kubesim.run_apiserver() as bare, clients(bare.url, 1) as (kube,):
        election = Election(kube, name=LEASE, namespace=NAMESPACE, timing=fast, readiness=readiness)
        async with anyio.create_task_group() as tg:
            await tg.start(election.run)
            readiness.set_ready()  # the lifespan, once everything started
            assert not readiness.ready
            assert f"election of Lease {NAMESPACE}/{LEASE}" in readiness.reason
            assert f"does the namespace {NAMESPACE} exist?" in readiness.reason
            bare.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
            await eventually(lambda: readiness.ready, timeout=10, what="ready once it leads")
            assert election.is_leader
            tg.cancel_scope.cancel()
