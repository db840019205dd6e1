"""Probing through the running app: busy sets and reachability as the fleet reports them,
against real fake lupine servers (settings: probe every 0.2 s, timeout 0.5 s)."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketStream

from rgpu_discovery.fleet import UNREACHABLE_AFTER
from rgpu_kubesim.lupine import LupineSpec, open_lupine_fleet, run_lupine
from rgpu_testkit import eventually

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


async def test_released_build_is_reachable_without_usage(sim, start, build) -> None:
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


SOAK_SERVERS = 200
SOAK_PROBES = 2000
FAILURES = ("timeout", "refused", "unreachable")


async def probes_reached(discovery, minimum: int) -> None:
    with anyio.fail_after(40):
        while discovery.total("rgpu_discovery_probes_total") < minimum:
            await anyio.sleep(0.05)


async def all_listed(discovery, servers: int):
    """The fleet once it lists every server (a loaded machine may deliver the last Node late)."""
    with anyio.fail_after(40):
        while len((fleet := await discovery.fleet()).servers) < servers:
            await anyio.sleep(0.05)
    return fleet


async def test_thousands_of_probes_of_released_builds_never_fail_a_healthy_server(
    sim, start, build
) -> None:
    # A generous timeout: this test is about resets, and a loaded machine must not turn
    # slowness into failures that say nothing about them.
    async with open_lupine_fleet() as fleet, start(RGPU_PROBE_TIMEOUT_SECONDS="10") as discovery:
        for i in range(SOAK_SERVERS):
            mode = "sniff" if i % 5 == 0 else "h2only"
            lupine = await fleet.start(LupineSpec(name=f"gpu-{i}", mode=mode, gpus=GPUS))
            sim.store.create("nodes", server_node(build, lupine.name, lupine))
        await probes_reached(discovery, SOAK_PROBES)
        fleet_now = await all_listed(discovery, SOAK_SERVERS)
        failures = sum(discovery.sample("rgpu_discovery_probes_total", result=r) for r in FAILURES)
        probes = discovery.total("rgpu_discovery_probes_total")
        opened = discovery.total("rgpu_discovery_probe_connections_total")
        asked = discovery.total("rgpu_discovery_version_queries_total")
        accepted = sum(lupine.connections for lupine in fleet)
    assert failures == 0
    assert all(s.reachable for s in fleet_now.servers)
    assert len(fleet_now.servers) == SOAK_SERVERS
    # The CUDA version is asked once per server (then every five minutes), on a connection
    # of its own.
    assert asked == SOAK_SERVERS
    assert opened == probes + asked
    # Probes still in flight have connected but are not counted yet: at most two per server.
    assert probes + asked <= accepted <= probes + asked + 2 * SOAK_SERVERS


def _version_known(discovery):
    async def known() -> bool:
        servers = (await discovery.fleet()).servers
        return bool(servers) and servers[0].cuda_version == "12.4"

    return known


async def test_stopped_released_build_is_unreachable_after_the_failures_and_back_at_once(
    sim, start, build
) -> None:
    async with (
        run_lupine(gpus=GPUS, mode="h2only") as lupine,
        start(RGPU_PROBE_INTERVAL_SECONDS="60", reprobe_min_interval=0.0) as discovery,
    ):
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.counted("rgpu_discovery_probes_total", 1, result="h2_alive")
        # The first probe has landed once the fleet shows the version it asked for.
        await eventually(_version_known(discovery), what="the CUDA version in the fleet")
        await lupine.set_fault("down")
        for failures in range(1, UNREACHABLE_AFTER + 1):
            assert (await discovery.fleet()).servers[0].reachable
            assert (await discovery.reprobe("gpu-a")).status_code == 200
            assert discovery.sample("rgpu_discovery_probes_total", result="refused") == failures
        assert not (await discovery.fleet()).servers[0].reachable
        await lupine.set_fault(None)
        assert (await discovery.reprobe("gpu-a")).status_code == 200
        assert (await discovery.fleet()).servers[0].reachable
        opened = discovery.sample("rgpu_discovery_probe_connections_total", server="gpu-a")
    # Each answered probe asked the CUDA version too: the first one, and the one that found
    # the server back (a restart is when lupine is upgraded).
    assert opened == lupine.connections == 4


async def test_404_metrics_means_reachable_without_usage(sim, start, build) -> None:
    async def not_found(stream: SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(SocketAttribute.local_port)

    async def dial(host: str, _: int) -> SocketStream:
        return await anyio.connect_tcp("127.0.0.1", port)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, not_found)
        sim.store.create("nodes", build.node("gpu-a", ip="10.9.9.9"))
        async with start(probe_dialer=dial) as discovery:
            await discovery.counted("rgpu_discovery_probes_total", 1, result="no_usage")
            server = (await discovery.fleet()).servers[0]
        tg.cancel_scope.cancel()
    assert (server.reachable, server.usage_reported, server.busy) == (True, False, frozenset())


async def test_connections_series_of_a_deleted_server_disappears(sim, start, build) -> None:
    async with run_lupine(gpus=GPUS, mode="h2only") as lupine, start() as discovery:
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.counted("rgpu_discovery_probe_connections_total", 1, server="gpu-a")
        sim.store.delete("nodes", "gpu-a")
        await discovery.fleet_when(lambda f: not f.servers)
        with anyio.fail_after(5):
            while discovery.registry.get_sample_value(
                "rgpu_discovery_probe_connections_total", {"server": "gpu-a"}
            ):
                await anyio.sleep(0.05)
