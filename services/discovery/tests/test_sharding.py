"""Several discovery replicas on one simulated cluster: they divide the servers (each probed
by one replica, counted at the fake lupine servers), hand a dead replica's servers over,
and serve the same fleet with the same revision, computed from the probe-state Leases
(settings: probe every 0.2 s; membership renewed every 0.25 s, dead after 1 s)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

from rgpu_contracts import Fleet
from rgpu_discovery import create_app
from rgpu_discovery.sharding import NOT_JOINED
from rgpu_kubesim import run_apiserver
from rgpu_kubesim.lupine import FakeLupine, LupineFleet, LupineSpec, open_lupine_fleet
from rgpu_runtime.replicas import MembershipTiming, member_lease_name
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

GPUS = ("GPU-0", "GPU-1")
SERVERS = 12
NAMESPACE = "rgpu-system"


def server_node(build, lupine: FakeLupine):
    cards = (build.card(g, i) for i, g in enumerate(GPUS))
    return build.node(
        lupine.name, server=str(lupine.port), ip="127.0.0.1", annotation=build.register(*cards)
    )


async def start_servers(sim, build, lupines: LupineFleet, count: int = SERVERS) -> None:
    for i in range(count):
        lupine = await lupines.start(LupineSpec(name=f"gpu-{i:02}", gpus=GPUS))
        sim.store.create("nodes", server_node(build, lupine))


@asynccontextmanager
async def replicas(start, count: int, **options) -> AsyncIterator[list]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(start(**options)) for _ in range(count)]


async def members_seen(replicas: Sequence, count: int) -> None:
    for replica in replicas:
        await eventually(
            lambda r=replica: r.sample("rgpu_discovery_members") == count,
            timeout=5.0,
            what=f"every replica seeing {count} members",
        )


def probes_by_replica(replicas: Sequence, server: str) -> tuple[float, ...]:
    return tuple(
        r.sample("rgpu_discovery_probe_connections_total", server=server) for r in replicas
    )


async def one_window(replicas: Sequence, servers: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """Probe counts per server and replica gained until every server was probed twice more."""
    before = {s: probes_by_replica(replicas, s) for s in servers}

    def gained() -> dict[str, tuple[float, ...]]:
        return {
            s: tuple(a - b for a, b in zip(probes_by_replica(replicas, s), before[s], strict=True))
            for s in servers
        }

    await eventually(
        lambda: all(sum(g) >= 2 for g in gained().values()),
        timeout=10.0,
        what="every server probed twice more",
    )
    return gained()


async def settled_fleet(replicas: Sequence, check: Callable[[Fleet], bool]) -> list[Fleet]:
    """Each replica's fleet once ``check`` holds on all of them and their revisions agree."""
    with anyio.fail_after(10):
        while True:
            fleets = [await r.fleet_when(check) for r in replicas]
            if len({f.revision for f in fleets}) == 1:
                return fleets
            await anyio.sleep(0.05)


def all_probed(count: int) -> Callable[[Fleet], bool]:
    return lambda f: len(f.servers) == count and all(s.usage_reported for s in f.servers)


@pytest.mark.parametrize("count", [2, 3])
async def test_each_server_is_probed_by_exactly_one_replica(sim, start, build, count) -> None:
    async with open_lupine_fleet() as lupines, replicas(start, count) as running:
        await start_servers(sim, build, lupines)
        await members_seen(running, count)
        names = [lupine.name for lupine in lupines]
        await one_window(running, names)  # probes launched before the ring settled
        accepted = {lupine.name: lupine.connections for lupine in lupines}
        window = await one_window(running, names)
        accepted = {lupine.name: lupine.connections - accepted[lupine.name] for lupine in lupines}
        owned = [r.sample("rgpu_discovery_owned_servers") for r in running]
    for server, gained in window.items():
        assert sum(1 for g in gained if g > 0) == 1, (server, gained)
        # Counted at the server: nobody else probed it (a probe in flight at either end of
        # the window is counted on one side only).
        assert abs(accepted[server] - sum(gained)) <= 1, (server, accepted[server], gained)
    assert sum(owned) == SERVERS
    assert all(share > 0 for share in owned)


async def test_replicas_serve_identical_fleets_with_identical_revisions(sim, start, build) -> None:
    async with open_lupine_fleet() as lupines, replicas(start, 2) as running:
        await start_servers(sim, build, lupines)
        first = await settled_fleet(running, all_probed(SERVERS))
        lupines.by_name("gpu-03").add_client("pod-a", ["GPU-1"])
        busy = await settled_fleet(running, lambda f: any(s.busy == {"GPU-1"} for s in f.servers))
    assert first[0].servers == first[1].servers
    assert busy[0].servers == busy[1].servers
    assert busy[0].revision > first[0].revision


async def test_a_replica_started_later_computes_the_same_revision(sim, start, build) -> None:
    async with open_lupine_fleet() as lupines, start() as early:
        await start_servers(sim, build, lupines)
        lupines.by_name("gpu-01").add_client("pod-a", ["GPU-0"])
        held = await early.fleet_when(
            lambda f: all_probed(SERVERS)(f) and any(s.busy for s in f.servers)
        )
        async with start() as late:
            await members_seen([early, late], 2)
            fleets = await settled_fleet([early, late], lambda f: True)
    assert fleets[0].revision == fleets[1].revision == held.revision
    assert fleets[0].servers == fleets[1].servers == held.servers


async def test_revisions_never_go_backwards_on_one_replica(sim, start, build) -> None:
    seen: list[int] = []
    async with open_lupine_fleet() as lupines, replicas(start, 2) as running:
        watched = running[0]
        fleet = await watched.fleet()
        seen.append(fleet.revision)
        await start_servers(sim, build, lupines, 6)
        for i, lupine in enumerate(lupines):
            lupine.add_client(f"pod-{i}", ["GPU-0"])
            while not any(s.name == lupine.name and s.busy for s in fleet.servers):
                fleet = await watched.fleet(since=fleet.revision, wait=2.0)
                seen.append(fleet.revision)
    assert seen == sorted(seen)
    assert len(set(seen)) > 6


async def test_a_dead_replicas_servers_are_taken_over(sim, start, build) -> None:
    async with open_lupine_fleet() as lupines, replicas(start, 2) as running:
        await start_servers(sim, build, lupines)
        async with start(identity="doomed") as doomed:
            await members_seen([*running, doomed], 3)
            names = [lupine.name for lupine in lupines]
            await one_window([*running, doomed], names)
        # It stopped cleanly and deleted its Lease; put the Lease back as a crash leaves it.
        lease = member_lease_name("discovery", "doomed")
        sim.store.create("leases", dead_lease(lease, "doomed"), namespace=NAMESPACE)
        await members_seen(running, 3)
        await members_seen(running, 2)
        window = await one_window(running, names)
    for server, gained in window.items():
        assert sum(1 for g in gained if g > 0) == 1, (server, gained)


def dead_lease(name: str, identity: str) -> dict[str, object]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"rgpu.io/membership": "discovery"},
        },
        "spec": {"holderIdentity": identity, "leaseDurationSeconds": 1, "renewTime": now},
    }


async def test_a_replica_leaving_cleanly_hands_over_at_once(sim, start, build) -> None:
    async with open_lupine_fleet() as lupines, start() as staying:
        await start_servers(sim, build, lupines)
        async with start() as leaving:
            await members_seen([staying, leaving], 2)
        await members_seen([staying], 1)
        assert staying.sample("rgpu_discovery_owned_servers") == SERVERS
        names = [lupine.name for lupine in lupines]
        window = await one_window([staying], names)
    assert all(gained[0] >= 2 for gained in window.values())


async def test_an_on_demand_probe_is_served_by_the_replica_asked(sim, start, build) -> None:
    async with (
        open_lupine_fleet() as lupines,
        replicas(start, 2, reprobe_min_interval=0.0) as running,
    ):
        await start_servers(sim, build, lupines, 4)
        await settled_fleet(running, all_probed(4))
        lupines.by_name("gpu-02").add_client("pod-a", ["GPU-0"])
        for replica in running:
            before = replica.sample("rgpu_discovery_probe_connections_total", server="gpu-02")
            response = await replica.reprobe("gpu-02")
            assert response.status_code == 200, response.text
            assert response.json()["busy"] == ["GPU-0"]
            after = replica.sample("rgpu_discovery_probe_connections_total", server="gpu-02")
            assert after > before
        other = await running[1].server_when("gpu-02", lambda s: s.busy == {"GPU-0"})
    assert other.busy == {"GPU-0"}


async def test_a_replica_that_cannot_join_says_so_on_readyz_until_it_can(make_settings) -> None:
    async with run_apiserver() as bare:  # no system namespace: no membership Lease can be written
        app = create_app(
            make_settings(RGPU_KUBE_URL=bare.url),
            registry=CollectorRegistry(),
            identity="discovery-1",
            membership=MembershipTiming(lease_seconds=0.5, renew_seconds=0.1),
        )
        async with (
            LifespanManager(app) as manager,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app)) as client,
        ):

            async def readyz() -> httpx.Response:
                return await client.get("http://discovery/readyz")

            await eventually(
                lambda: _status_is(readyz, 503, NOT_JOINED), timeout=10, what="503 naming why"
            )
            bare.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
            await eventually(lambda: _status_is(readyz, 200, ""), timeout=10, what="ready")


async def _status_is(readyz, status: int, words: str) -> bool:
    reply = await readyz()
    return reply.status_code == status and words in reply.text
