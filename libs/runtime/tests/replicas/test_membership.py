"""Membership through Leases on the simulated apiserver, and the hash ring that divides keys
among the live members."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_runtime.kube import KubeClient, kube_client
from rgpu_runtime.replicas import Membership, MembershipTiming, member_lease_name
from rgpu_runtime.replicas._membership import HashRing
from rgpu_runtime.serving import Readiness
from rgpu_runtime.settings import Settings
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

KEYS = [f"gpu-{i:04}" for i in range(1200)]
FAST = MembershipTiming(lease_seconds=1.0, renew_seconds=0.2)
NAMESPACE = "rgpu-system"


def test_every_ring_built_from_the_same_members_gives_the_same_owners() -> None:
    first, second = HashRing(["b", "a", "c"]), HashRing(["c", "b", "a"])
    assert [first.owner(k) for k in KEYS] == [second.owner(k) for k in KEYS]
    assert first == second


def test_keys_are_divided_roughly_evenly() -> None:
    shares = Counter(HashRing(["a", "b", "c"]).owner(k) for k in KEYS)
    assert set(shares) == {"a", "b", "c"}
    assert all(240 < share < 560 for share in shares.values()), shares


def test_a_member_joining_takes_keys_only_from_the_others_never_moves_the_rest() -> None:
    before, after = HashRing(["a", "b"]), HashRing(["a", "b", "c"])
    moved = [k for k in KEYS if before.owner(k) != after.owner(k)]
    assert all(after.owner(k) == "c" for k in moved)
    assert 0 < len(moved) < len(KEYS) / 2


def test_an_empty_ring_owns_nothing() -> None:
    assert HashRing([]).owner("gpu-0") is None


def test_a_long_identity_gets_a_hashed_lease_name_within_63_characters() -> None:
    short, long = member_lease_name("discovery", "pod-1"), member_lease_name("discovery", "x" * 80)
    assert short == "discovery-member-pod-1"
    assert len(long) <= 63
    assert long != member_lease_name("discovery", "x" * 81)


@asynccontextmanager
async def cluster() -> AsyncIterator[tuple[SimApiServer, KubeClient]]:
    async with run_apiserver() as sim:
        sim.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="discovery")
        async with kube_client(settings) as kube:
            yield sim, kube


@asynccontextmanager
async def member(kube: KubeClient, identity: str) -> AsyncIterator[Membership]:
    membership = Membership(
        kube=kube, namespace=NAMESPACE, group="discovery", identity=identity, timing=FAST
    )
    async with anyio.create_task_group() as tg:
        await tg.start(membership.run)
        yield membership
        tg.cancel_scope.cancel()


async def members_are(membership: Membership, *identities: str) -> None:
    await eventually(
        lambda: membership.ring.value.members == set(identities),
        timeout=5.0,
        what=f"{membership.identity} seeing {identities}",
    )


async def test_members_see_each_other_and_split_the_keys() -> None:
    async with cluster() as (_, kube), AsyncExitStack() as stack:
        a = await stack.enter_async_context(member(kube, "a"))
        b = await stack.enter_async_context(member(kube, "b"))
        await members_are(a, "a", "b")
        await members_are(b, "a", "b")
        owners = [(a.owns(k), b.owns(k)) for k in KEYS]
    assert all(x != y for x, y in owners)


async def test_a_member_that_stops_deletes_its_lease_and_the_others_take_over() -> None:
    async with cluster() as (sim, kube), member(kube, "a") as a:
        async with member(kube, "b"):
            await members_are(a, "a", "b")
        await members_are(a, "a")
        leases = sim.store.list("leases", namespace=NAMESPACE)
    assert [lease["metadata"]["name"] for lease in leases] == [member_lease_name("discovery", "a")]
    assert all(a.owns(k) for k in KEYS[:100])


async def test_a_member_that_stops_renewing_is_dead_after_the_lease_time() -> None:
    async with cluster() as (sim, kube), member(kube, "a") as a:
        lease = {
            "metadata": {
                "name": "discovery-member-b",
                "labels": {"rgpu.io/membership": "discovery"},
            },
            "spec": {"holderIdentity": "b", "leaseDurationSeconds": 1},
        }
        sim.store.create("leases", lease, namespace=NAMESPACE)
        await members_are(a, "a", "b")
        await members_are(a, "a")


class FakeClock:
    """Monotonic seconds the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_member_that_hears_nothing_of_its_own_renewals_judges_nobody_dead() -> None:
    clock = FakeClock()
    async with cluster() as (sim, kube):
        lease = {
            "metadata": {
                "name": "discovery-member-b",
                "labels": {"rgpu.io/membership": "discovery"},
            },
            "spec": {"holderIdentity": "b", "leaseDurationSeconds": 1},
        }
        sim.store.create("leases", lease, namespace=NAMESPACE)
        a = Membership(
            kube=kube,
            namespace=NAMESPACE,
            group="discovery",
            identity="a",
            timing=FAST,
            clock=clock,
        )
        async with anyio.create_task_group() as tg:
            await tg.start(a.run)
            sim.faults.set_error(verb="update", resource="leases", rate=1.0)
            clock.now += 60.0
            tried = lease_updates(sim)
            # Four renewals refused: a heard none of its own, so b's silence proves nothing.
            await eventually(lambda: lease_updates(sim) >= tried + 4, timeout=5.0)
            deaf = a.live()
            sim.faults.clear()
            await eventually(lambda: a.live() == {"a"}, timeout=5.0, what="b judged dead")
            # Dead for longer than forget_after lease periods: its Lease is deleted, a's kept.
            await eventually(lambda: lease_names(sim) == ["discovery-member-a"], timeout=5.0)
            tg.cancel_scope.cancel()
    assert deaf == {"a", "b"}


def lease_updates(sim: SimApiServer) -> int:
    """Lease updates (renewals) the apiserver has received so far."""
    counts = sim.meter.snapshot()
    return sum(
        c.requests for k, c in counts.items() if (k.verb, k.resource) == ("update", "leases")
    )


def lease_names(sim: SimApiServer) -> list[str]:
    leases = sim.store.list("leases", namespace=NAMESPACE)
    return [lease["metadata"]["name"] for lease in leases]


async def test_a_member_that_cannot_write_its_lease_blocks_readiness_until_it_can() -> None:
    readiness = Readiness()
    readiness.set_ready()
    async with run_apiserver() as bare:  # no system namespace: every write is a 404
        settings = Settings.from_env({"RGPU_KUBE_URL": bare.url}, service="discovery")
        async with kube_client(settings) as kube, anyio.create_task_group() as tg:
            membership = Membership(
                kube=kube,
                namespace=NAMESPACE,
                group="discovery",
                identity="a",
                timing=FAST,
                readiness=readiness,
            )
            tg.start_soon(membership.run)
            await eventually(lambda: not readiness.ready, timeout=5, what="blocked")
            assert "not a member of discovery" in readiness.reason
            assert f"does the namespace {NAMESPACE} exist?" in readiness.reason
            bare.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
            await eventually(lambda: readiness.ready, timeout=10, what="ready once a member")
            tg.cancel_scope.cancel()


async def test_renewals_failing_longer_than_the_lease_block_readiness() -> None:
    readiness = Readiness()
    readiness.set_ready()
    async with cluster() as (sim, kube), anyio.create_task_group() as tg:
        membership = Membership(
            kube=kube,
            namespace=NAMESPACE,
            group="discovery",
            identity="a",
            timing=FAST,
            readiness=readiness,
        )
        await tg.start(membership.run)
        assert readiness.ready
        sim.faults.set_error(resource="leases", rate=1.0, code=503)
        await eventually(lambda: not readiness.ready, timeout=10, what="blocked")
        sim.faults.clear()
        await eventually(lambda: readiness.ready, timeout=10, what="ready again")
        tg.cancel_scope.cancel()
