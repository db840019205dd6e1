"""On-demand re-probes through the running app (``POST /v1/servers/{name}/probe``), against
real fake lupine servers and kubesim (settings: probe timeout 0.5 s)."""

from __future__ import annotations

import anyio
import orjson
import pytest

from rgpu_contracts import Server
from rgpu_discovery import create_app
from rgpu_kubesim.lupine import run_lupine

pytestmark = pytest.mark.anyio

GPUS = ("GPU-0", "GPU-1", "GPU-2")
LONG = "60"
"""A periodic interval no test waits out: whatever changes within a test, a re-probe saw."""


def server_node(build, name: str, lupine=None, **overrides):
    args = {
        "server": str(lupine.port) if lupine is not None else "1",
        "ip": "127.0.0.1",
        "annotation": build.register(*(build.card(g, i) for i, g in enumerate(GPUS))),
    }
    args.update(overrides)
    return build.node(name, **args)


def decoded(response) -> tuple[Server, int, str]:
    """The ``Server`` body, the revision header and the probe header of a 200 answer."""
    assert response.status_code == 200, response.text
    server = Server.from_dict(orjson.loads(response.content))
    return server, int(response.headers["x-rgpu-revision"]), response.headers["x-rgpu-probe"]


async def test_disconnect_is_seen_at_once_despite_a_long_interval_and_wakes_the_long_poll(
    sim, start, build
) -> None:
    async with (
        run_lupine(gpus=GPUS) as lupine,
        start(RGPU_PROBE_INTERVAL_SECONDS=LONG, reprobe_min_interval=0.0) as discovery,
    ):
        lupine.add_client("pod-a", ["GPU-1"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.busy == {"GPU-1"})
        held = await discovery.fleet()
        lupine.remove_client("pod-a")
        woken = []

        async def long_poll() -> None:
            woken.append(await discovery.fleet(since=held.revision, wait=30))

        with anyio.fail_after(3):
            async with anyio.create_task_group() as tg:
                tg.start_soon(long_poll)
                await anyio.sleep(0.1)
                assert woken == []
                server, revision, outcome = decoded(await discovery.reprobe("gpu-a"))
    assert (outcome, server.busy, server.usage_reported, server.reachable) == (
        "probed",
        frozenset(),
        True,
        True,
    )
    assert revision > held.revision
    assert woken[0].revision == revision
    assert woken[0].servers == (server,)


async def test_reprobe_that_finds_nothing_new_keeps_the_revision(sim, start, build) -> None:
    async with (
        run_lupine(gpus=GPUS) as lupine,
        start(RGPU_PROBE_INTERVAL_SECONDS=LONG, reprobe_min_interval=0.0) as discovery,
    ):
        lupine.add_client("pod-a", ["GPU-0"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.busy == {"GPU-0"})
        held = await discovery.fleet()
        server, revision, outcome = decoded(await discovery.reprobe("gpu-a"))
        assert discovery.sample("rgpu_discovery_probes_total", result="usage") == 2
    assert (outcome, revision, server.busy) == ("probed", held.revision, {"GPU-0"})
    assert (server,) == held.servers


async def test_unknown_server_and_client_node_are_404_naming_them(sim, start, build) -> None:
    sim.store.create("nodes", build.node("node-1", server=None))
    async with start() as discovery:
        await discovery.fleet_when(lambda f: f.servers == ())
        for name in ("gpu-nope", "node-1"):
            response = await discovery.reprobe(name)
            body = response.json()
            assert (response.status_code, body["code"], body["retryable"]) == (
                404,
                "unknown_server",
                False,
            )
            assert repr(name) in body["message"]
        assert discovery.total("rgpu_discovery_on_demand_probes_total") == 0


async def test_server_without_internal_ip_is_409_saying_why(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-x", ip=None))
    async with start() as discovery:
        await discovery.fleet_when(lambda f: len(f.servers) == 1)
        response = await discovery.reprobe("gpu-x")
    body = response.json()
    assert (response.status_code, body["code"]) == (409, "no_endpoint")
    assert "InternalIP" in body["message"]


async def test_before_the_first_list_is_a_retryable_503(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a"))
    sim.faults.set_error(verb="list", resource="nodes", rate=1.0, code=503)
    async with start(wait_ready=False) as discovery:
        response = await discovery.reprobe("gpu-a")
    body = response.json()
    assert (response.status_code, body["code"], body["retryable"]) == (503, "not_listed_yet", True)
    assert response.headers["retry-after"] == "1"


async def test_server_probed_moments_ago_answers_its_state_without_probing(
    sim, start, build
) -> None:
    async with (
        run_lupine(gpus=GPUS) as lupine,
        start(RGPU_PROBE_INTERVAL_SECONDS=LONG, reprobe_min_interval=60.0) as discovery,
    ):
        lupine.add_client("pod-a", ["GPU-2"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.busy == {"GPU-2"})
        held = await discovery.fleet()
        lupine.remove_client("pod-a")
        answers = [decoded(await discovery.reprobe("gpu-a")) for _ in range(3)]
        probes = discovery.total("rgpu_discovery_probes_total")
        limited = discovery.sample("rgpu_discovery_on_demand_probes_total", outcome="rate_limited")
    assert {(s.busy, revision, outcome) for s, revision, outcome in answers} == {
        (frozenset({"GPU-2"}), held.revision, "rate_limited")
    }
    assert (probes, limited) == (1, 3)


async def test_concurrent_requests_share_one_probe(sim, start, build) -> None:
    async with (
        run_lupine(gpus=GPUS) as lupine,
        start(RGPU_PROBE_INTERVAL_SECONDS=LONG, reprobe_min_interval=0.0) as discovery,
    ):
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.usage_reported)
        await lupine.set_fault("hang")
        answers = []

        async def ask() -> None:
            answers.append(decoded(await discovery.reprobe("gpu-a")))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(ask)
        timeouts = discovery.sample("rgpu_discovery_probes_total", result="timeout")
        counted = {
            outcome: discovery.sample("rgpu_discovery_on_demand_probes_total", outcome=outcome)
            for outcome in ("probed", "coalesced", "rate_limited")
        }
    assert sorted(outcome for _, _, outcome in answers) == ["coalesced"] * 4 + ["probed"]
    assert len({(server, revision) for server, revision, _ in answers}) == 1
    assert all(server.reachable for server, _, _ in answers)
    assert timeouts == 1
    assert counted == {"probed": 1, "coalesced": 4, "rate_limited": 0}


async def test_down_server_keeps_busy_and_turns_unreachable_on_the_second_reprobe(
    sim, start, build
) -> None:
    async with (
        run_lupine(gpus=GPUS) as lupine,
        start(RGPU_PROBE_INTERVAL_SECONDS=LONG, reprobe_min_interval=0.0) as discovery,
    ):
        lupine.add_client("pod-a", ["GPU-1"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.busy == {"GPU-1"})
        held = await discovery.fleet()
        await lupine.set_fault("down")
        first, first_revision, _ = decoded(await discovery.reprobe("gpu-a"))
        second, second_revision, _ = decoded(await discovery.reprobe("gpu-a"))
    assert (first.reachable, first.busy, first_revision) == (True, {"GPU-1"}, held.revision)
    assert (second.reachable, second.busy) == (False, {"GPU-1"})
    assert second_revision > held.revision


async def test_reprobe_failure_then_periodic_failure_make_a_server_unreachable(
    sim, start, build
) -> None:
    async with (
        run_lupine(gpus=GPUS) as lupine,
        start(RGPU_PROBE_INTERVAL_SECONDS="0.5", reprobe_min_interval=0.0) as discovery,
    ):
        lupine.add_client("pod-a", ["GPU-1"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        # Right after a periodic round, so the next one is about 0.5 s away.
        await discovery.counted("rgpu_discovery_probes_total", 2, result="usage")
        await lupine.set_fault("down")
        after_one, _, _ = decoded(await discovery.reprobe("gpu-a"))
        assert (after_one.reachable, after_one.busy) == (True, {"GPU-1"})
        server = await discovery.server_when("gpu-a", lambda s: not s.reachable, timeout=2)
        refused = discovery.sample("rgpu_discovery_probes_total", result="refused")
    assert (server.busy, refused) == ({"GPU-1"}, 2)


async def test_periodic_failure_then_reprobe_failure_make_a_server_unreachable(
    sim, start, build
) -> None:
    async with (
        run_lupine(gpus=GPUS) as lupine,
        start(RGPU_PROBE_INTERVAL_SECONDS="0.5", reprobe_min_interval=0.0) as discovery,
    ):
        lupine.add_client("pod-a", ["GPU-1"])
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.server_when("gpu-a", lambda s: s.busy == {"GPU-1"})
        await lupine.set_fault("down")
        await discovery.counted("rgpu_discovery_probes_total", 1, result="refused")
        # The counter moves as the probe ends; its result is folded in on the next turn.
        await anyio.sleep(0.05)
        assert (await discovery.fleet()).servers[0].reachable
        server, _, outcome = decoded(await discovery.reprobe("gpu-a"))
        refused = discovery.sample("rgpu_discovery_probes_total", result="refused")
    assert (outcome, server.reachable, server.busy, refused) == ("probed", False, {"GPU-1"}, 2)


async def test_on_demand_series_exist_from_the_start(start) -> None:
    async with start() as discovery:
        text = (await discovery.client.get("/metrics")).text
    for outcome in ("probed", "coalesced", "rate_limited"):
        assert f'rgpu_discovery_on_demand_probes_total{{outcome="{outcome}"}} 0.0' in text


async def test_get_is_not_allowed_on_the_probe_route(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a", ip=None))
    async with start() as discovery:
        response = await discovery.client.get("/v1/servers/gpu-a/probe")
    assert (response.status_code, response.json()["code"]) == (405, "method_not_allowed")


def test_negative_min_interval_is_refused_naming_it(make_settings) -> None:
    with pytest.raises(ValueError, match="reprobe_min_interval must be >= 0"):
        create_app(make_settings(), reprobe_min_interval=-0.1)


async def test_burst_of_on_demand_probes_costs_the_host_no_extra_connection(
    sim, start, build
) -> None:
    async with (
        run_lupine(gpus=GPUS, mode="h2only") as lupine,
        start(RGPU_PROBE_INTERVAL_SECONDS=LONG, reprobe_min_interval=60.0) as discovery,
    ):
        sim.store.create("nodes", server_node(build, "gpu-a", lupine))
        await discovery.counted("rgpu_discovery_probes_total", 1, result="h2_alive")
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(discovery.reprobe, "gpu-a")
        limited = discovery.sample("rgpu_discovery_on_demand_probes_total", outcome="rate_limited")
        opened = discovery.sample("rgpu_discovery_probe_connections_total", server="gpu-a")
    # The first probe and its CUDA version question; the burst adds nothing.
    assert (lupine.connections, opened, limited) == (2, 2, 20)
