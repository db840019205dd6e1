"""Probing through the running app: busy sets and reachability as the fleet reports them,
against real fake lupine servers (settings: probe every 0.2 s, timeout 0.5 s)."""

from __future__ import annotations

import pytest

from rgpu_kubesim.lupine import run_lupine

pytestmark = pytest.mark.anyio

GPUS = ("GPU-0", "GPU-1", "GPU-2")


def server_node(build, name: str, lupine):
    cards = (build.card(g, i) for i, g in enumerate(GPUS))
    return build.node(
        name, server=str(lupine.port), ip="127.0.0.1", annotation=build.register(*cards)
    )


async def test_busy_set_follows_clients_and_empty_success_clears_it(sim, start, build) -> None:
    async with run_lupine(gpus=GPUS) as lupine, start() as discovery:
        lupine.add_client("pod-a", ["GPU-0"])
        lupine.add_client("pod-b", ["GPU-2"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.busy == {"GPU-0", "GPU-2"})
        lupine.remove_client("pod-a")
        lupine.remove_client("pod-b")
        server = await discovery.server_when("gpu-a", lambda s: not s.busy)
        assert server.usage_reported
        assert discovery.sample("rgpu_discovery_probes_total", result="usage") >= 2


@pytest.mark.parametrize(
    ("fault", "result"), [("error500", "http_error"), ("truncated", "bad_body")]
)
async def test_failed_reply_keeps_the_last_busy_set(sim, start, build, fault, result) -> None:
    async with run_lupine(gpus=GPUS) as lupine, start() as discovery:
        lupine.add_client("pod-a", ["GPU-1"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.busy == {"GPU-1"})
        fleet = await discovery.fleet()
        await lupine.set_fault(fault)
        lupine.remove_client("pod-a")
        await discovery.counted("rgpu_discovery_probes_total", 2, result=result)
        after = await discovery.fleet()
        assert after.revision == fleet.revision
        assert (after.servers[0].busy, after.servers[0].reachable) == ({"GPU-1"}, True)


async def test_hang_past_the_timeout_keeps_busy_and_turns_unreachable_after_two(
    sim, start, build
) -> None:
    async with run_lupine(gpus=GPUS) as lupine, start() as discovery:
        lupine.add_client("pod-a", ["GPU-1"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.busy == {"GPU-1"})
        await lupine.set_fault("hang")
        await discovery.counted("rgpu_discovery_probes_total", 1, result="timeout")
        assert (await discovery.fleet()).servers[0].reachable
        server = await discovery.server_when("gpu-a", lambda s: not s.reachable)
        assert server.busy == {"GPU-1"}
        assert discovery.sample("rgpu_discovery_probes_total", result="timeout") >= 2


async def test_down_server_turns_unreachable_and_comes_back(sim, start, build) -> None:
    async with run_lupine(gpus=GPUS) as lupine, start() as discovery:
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.usage_reported)
        await lupine.set_fault("down")
        await discovery.server_when("gpu-a", lambda s: not s.reachable)
        await lupine.set_fault(None)
        await discovery.server_when("gpu-a", lambda s: s.reachable)


async def test_h2only_server_is_reachable_without_usage(sim, start, build) -> None:
    async with run_lupine(gpus=GPUS, mode="h2only") as lupine, start() as discovery:
        lupine.add_client("pod-a", ["GPU-1"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.counted("rgpu_discovery_probes_total", 2, result="h2_alive")
        server = (await discovery.fleet()).servers[0]
    assert (server.reachable, server.usage_reported, server.busy) == (True, False, frozenset())


async def test_new_server_is_probed_at_once_not_an_interval_later(sim, start, build) -> None:
    async with run_lupine(gpus=GPUS) as lupine, start(RGPU_PROBE_INTERVAL_SECONDS="30") as d:
        lupine.add_client("pod-a", ["GPU-2"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await d.server_when("gpu-a", lambda s: s.busy == {"GPU-2"}, timeout=2.0)
