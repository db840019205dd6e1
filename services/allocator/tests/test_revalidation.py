"""Busy refusals re-checked with discovery: a real app on kubesim, discovery faked at the
transport (its probe endpoint answers what ``FakeDiscovery.probed`` says lupine reports)."""

from __future__ import annotations

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from rgpu_allocator.clients import DiscoveryClient
from rgpu_allocator.instruments import Instruments
from rgpu_allocator.ledger import Ledger
from rgpu_allocator.pods import PodIndex
from rgpu_allocator.revalidation import MAX_SERVERS, PROBES_PER_SECOND, Reprober
from rgpu_placement import FleetView
from rgpu_runtime.feeds import DiscoveryMirror

pytestmark = pytest.mark.anyio


def reprobes(registry: CollectorRegistry, outcome: str) -> float:
    return registry.get_sample_value("rgpu_allocator_reprobes_total", {"outcome": outcome}) or 0.0


async def test_server_busy_in_the_cached_fleet_but_free_when_reprobed_gets_booked(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", busy=(0,))))
    discovery.probed["gpu-a"] = build.server("gpu-a")
    registry = CollectorRegistry()
    pod = cluster.pod("waiter")
    async with kit.running_allocator(sim.url, discovery, registry) as client:
        got = await client.post("/v1/allocations", json=kit.ask(pod))
    assert got.status_code == 200, got.text
    assert got.json()["server"] == "gpu-a"
    assert cluster.holders() == {"gpu-a": ["waiter"]}
    assert discovery.probes == ["gpu-a"]
    assert reprobes(registry, "answered") == 1


async def test_server_still_busy_when_reprobed_is_refused_as_busy(build, kit, sim, cluster):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", busy=(0,))))
    registry = CollectorRegistry()
    async with kit.running_allocator(sim.url, discovery, registry) as client:
        got = await client.post("/v1/allocations", json=kit.ask(cluster.pod("waiter")))
    assert got.status_code == 409
    assert got.json()["message"] == "4/4 CardBusyOnServer"
    assert discovery.probes == ["gpu-a"]
    assert reprobes(registry, "answered") == 1


@pytest.mark.parametrize(
    ("status", "outcome"), [(404, "not_probed"), (409, "not_probed"), (503, "unavailable")]
)
async def test_reprobe_discovery_cannot_answer_leaves_the_busy_refusal_standing(
    build, kit, sim, cluster, status, outcome
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", busy=(0,))))
    discovery.probed["gpu-a"] = build.server("gpu-a")
    discovery.probe_status = status
    registry = CollectorRegistry()
    async with kit.running_allocator(sim.url, discovery, registry) as client:
        got = await client.post("/v1/allocations", json=kit.ask(cluster.pod("waiter")))
    assert got.status_code == 409
    assert got.json()["message"] == "4/4 CardBusyOnServer"
    assert cluster.holders() == {}
    assert reprobes(registry, outcome) == 1


async def test_card_mode_reprobe_frees_only_the_cards_lupine_no_longer_reports(
    build, kit, sim, cluster
):
    discovery = kit.FakeDiscovery(build.fleet(build.server("gpu-a", cards=2, busy=(0, 1))))
    discovery.probed["gpu-a"] = build.server("gpu-a", cards=2, busy=(0,))
    pod = cluster.pod("waiter")
    async with kit.running_allocator(sim.url, discovery, RGPU_GRANULARITY="card") as client:
        got = await client.post("/v1/allocations", json=kit.ask(pod))
    assert got.status_code == 200, got.text
    assert got.json()["cards"] == [f"gpu-a/{build.uuid('gpu-a', 1)}"]


# --- the reprober alone, over discovery's fake transport ---------------------------------


class Rig:
    def __init__(self, discovery, *, monotonic=lambda: 0.0, handler=None) -> None:
        self.discovery = discovery
        self.registry = CollectorRegistry()
        instruments = Instruments(
            self.registry,
            ledger=Ledger(),
            pods=PodIndex(),
            discovery=DiscoveryMirror(FleetView.build, topology_keys=()),
        )
        self.http = httpx.AsyncClient(
            transport=httpx.MockTransport(handler or discovery.handler),
            base_url="http://discovery.test",
        )
        self.reprober = Reprober(DiscoveryClient(self.http), instruments, monotonic=monotonic)

    def view(self) -> FleetView:
        return FleetView.build(self.discovery.fleet, None, ())


def busy_fleet(build, names):
    return build.fleet(*(build.server(n, busy=(0,)) for n in names))


async def test_reprobes_only_the_best_placed_few_servers_per_refusal(build, kit):
    names = [f"gpu-{i}" for i in range(MAX_SERVERS + 2)]
    discovery = kit.FakeDiscovery(busy_fleet(build, names))
    rig = Rig(discovery)
    async with rig.http:
        fresh = await rig.reprober.refresh(rig.view(), list(reversed(names)))
    assert fresh is None  # every server is still busy: nothing to decide again on
    assert sorted(discovery.probes) == sorted(list(reversed(names))[:MAX_SERVERS])


async def test_reprobe_budget_holds_under_a_storm_of_refusals_and_refills_with_time(build, kit):
    names = [f"gpu-{i}" for i in range(MAX_SERVERS)]
    discovery = kit.FakeDiscovery(busy_fleet(build, names))
    now = [0.0]
    rig = Rig(discovery, monotonic=lambda: now[0])
    storm = int(PROBES_PER_SECOND)
    async with rig.http:
        for _ in range(storm):
            await rig.reprober.refresh(rig.view(), names)
        assert len(discovery.probes) == int(PROBES_PER_SECOND)
        now[0] += 1.0 / PROBES_PER_SECOND
        await rig.reprober.refresh(rig.view(), names)
    assert len(discovery.probes) == int(PROBES_PER_SECOND) + 1
    over = reprobes(rig.registry, "over_budget")
    assert over == storm * MAX_SERVERS + MAX_SERVERS - len(discovery.probes)


async def test_slow_reprobe_gives_up_within_its_timeout_and_keeps_the_cached_state(build, kit):
    discovery = kit.FakeDiscovery(busy_fleet(build, ["gpu-a"]))

    async def stalled(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(30)
        return await discovery.handler(request)

    rig = Rig(discovery, handler=stalled)
    async with rig.http:
        with anyio.fail_after(5):
            fresh = await rig.reprober.refresh(rig.view(), ["gpu-a"])
    assert fresh is None
    assert reprobes(rig.registry, "unavailable") == 1


async def test_reprobe_answer_for_another_server_is_not_applied(build, kit):
    discovery = kit.FakeDiscovery(busy_fleet(build, ["gpu-a", "gpu-b"]))
    discovery.probed["gpu-a"] = build.server("gpu-b")
    rig = Rig(discovery)
    async with rig.http:
        fresh = await rig.reprober.refresh(rig.view(), ["gpu-a"])
    assert fresh is None
    assert reprobes(rig.registry, "not_probed") == 1
