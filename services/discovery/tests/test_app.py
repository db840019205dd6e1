"""Discovery end to end: the real app against kubesim over HTTP and real fake lupine servers."""

from __future__ import annotations

import anyio
import pytest

from rgpu_kubesim.lupine import run_lupine

pytestmark = pytest.mark.anyio

GPUS = ("GPU-0", "GPU-1")


async def test_fleet_has_seeded_servers_cards_and_busy_sets(sim, start, build) -> None:
    async with run_lupine(gpus=GPUS) as lupine:
        lupine.add_client("pod-a", ["GPU-1"])
        annotation = build.register(build.card("GPU-0"), build.card("GPU-1", 1))
        sim.store.create(
            "nodes",
            build.node("gpu-a", server=str(lupine.port), ip="127.0.0.1", annotation=annotation),
        )
        sim.store.create("nodes", build.node("node-1", server=None, labels={build.rack: "r1"}))
        async with start() as discovery:
            fleet = await discovery.fleet_when(lambda f: bool(f.servers and f.servers[0].busy))
            (server,) = fleet.servers
            assert (server.name, server.endpoint, server.ready) == ("gpu-a", lupine.endpoint, True)
            assert [c.id for c in server.cards] == ["gpu-a/GPU-0", "gpu-a/GPU-1"]
            assert (server.busy, server.usage_reported, server.reachable) == ({"GPU-1"}, True, True)
            topology = await discovery.topology()
            assert [(n.name, n.labels) for n in topology.nodes] == [
                ("node-1", ((build.rack, "r1"),))
            ]


def server_node(build, name: str, lupine=None, **overrides):
    """A server Node pointing at ``lupine`` (or at a closed port) with its GPUs registered."""
    gpus = GPUS if lupine is None else tuple(g.uuid for g in lupine.gpus)
    args = {
        "server": str(lupine.port) if lupine is not None else "1",
        "ip": "127.0.0.1",
        "annotation": build.register(*(build.card(g, i) for i, g in enumerate(gpus))),
    }
    args.update(overrides)
    return build.node(name, **args)


def named(fleet, name: str):
    return next(s for s in fleet.servers if s.name == name)


async def test_port_label_edge_cases_on_real_nodes(sim, start, build) -> None:
    labels = {"gpu-e": "", "gpu-p": "24000", "gpu-n": "not-a-port", "gpu-z": "0", "gpu-o": "70000"}
    for name, label in labels.items():
        sim.store.create("nodes", server_node(build, name, server=label, ip="10.0.0.1"))
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 5)
    ports = {s.name: (s.port, s.endpoint, s.error) for s in fleet.servers}
    assert ports == {
        "gpu-e": (14833, "10.0.0.1:14833", None),
        "gpu-n": (14833, "10.0.0.1:14833", None),
        "gpu-o": (14833, "10.0.0.1:14833", None),
        "gpu-p": (24000, "10.0.0.1:24000", None),
        "gpu-z": (14833, "10.0.0.1:14833", None),
    }


async def test_ipv6_and_missing_internal_ip(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-6", server="24000", ip="fd00::1"))
    sim.store.create("nodes", server_node(build, "gpu-x", ip=None))
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 2)
    assert named(fleet, "gpu-6").endpoint == "[fd00::1]:24000"
    missing = named(fleet, "gpu-x")
    assert (missing.endpoint, missing.cards) == (None, ())
    assert missing.error is not None
    assert "InternalIP" in missing.error


async def test_mixed_modes_and_absent_health(sim, start, build, load_fixture) -> None:
    examples = load_fixture("hami/node-register-examples.json")
    node = server_node(build, "gpu-b", annotation=examples["mixed_modes_one_unhealthy"])
    sim.store.create("nodes", node)
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 1)
    cards = [(c.id, c.healthy) for c in fleet.servers[0].cards]
    assert cards == [("gpu-b/GPU-aaa", True), ("gpu-b/GPU-bbb", False)]


async def test_garbage_annotation_lists_server_with_error_and_records_one_event(
    sim, start, build
) -> None:
    sim.store.create("nodes", server_node(build, "gpu-g", annotation="{not json"))
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 1)
        (server,) = fleet.servers
        assert server.cards == ()
        assert server.error is not None
        assert "hami.io/node-nvidia-register" in server.error
        sim.store.patch("nodes", "gpu-g", {"metadata": {"labels": {"team": "a"}}})
        sim.store.patch("nodes", "gpu-g", {"metadata": {"labels": {"team": "b"}}})
        await discovery.counted("rgpu_discovery_node_events_total", 1, outcome="posted")
        await anyio.sleep(0.2)
    events = sim.store.list("events", namespace="default")
    assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events] == [
        ("Node", "gpu-g")
    ]
    assert events[0]["type"] == "Warning"
    assert "hami.io/node-nvidia-register" in events[0]["message"]


async def test_server_going_not_ready_and_back(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a"))
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 1)
        set_ready(sim, "gpu-a", "False")
        fleet = await discovery.fleet_when(lambda f: not f.servers[0].ready)
        assert len(fleet.servers[0].cards) == 2
        set_ready(sim, "gpu-a", "True")
        await discovery.fleet_when(lambda f: f.servers[0].ready)


def set_ready(sim, name: str, status: str) -> None:
    conditions = [{"type": "Ready", "status": status, "reason": "Test"}]
    sim.store.patch("nodes", name, {"status": {"conditions": conditions}}, subresource="status")


async def test_deleted_node_leaves_the_fleet(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a"))
    sim.store.create("nodes", server_node(build, "gpu-b"))
    async with start() as discovery:
        await discovery.fleet_when(lambda f: len(f.servers) == 2)
        sim.store.delete("nodes", "gpu-a")
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 1)
    assert fleet.servers[0].name == "gpu-b"


async def test_watch_cut_resumes_without_losing_the_fleet(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a"))
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 1)
        sim.faults.cut_watches()
        assert (await discovery.fleet()).revision == fleet.revision
        sim.store.create("nodes", server_node(build, "gpu-b"))
        await discovery.fleet_when(lambda f: len(f.servers) == 2)


async def test_expired_watch_relists_and_keeps_the_fleet(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a"))
    sim.store.create("nodes", server_node(build, "gpu-b"))
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 2)
        sim.store.delete("nodes", "gpu-b")
        sim.faults.expire_before()
        sim.faults.cut_watches()
        after = await discovery.fleet_when(lambda f: len(f.servers) == 1)
        assert after.revision > fleet.revision
        await discovery.counted("rgpu_discovery_watch_restarts_total", 1, cause="expired")
        sim.store.create("nodes", server_node(build, "gpu-c"))
        await discovery.fleet_when(lambda f: {s.name for s in f.servers} == {"gpu-a", "gpu-c"})


async def test_apiserver_down_at_start_is_not_ready_then_ready(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a"))
    sim.faults.set_error(verb="list", resource="nodes", rate=1.0, code=503)
    async with start(wait_ready=False) as discovery:
        await anyio.sleep(0.3)
        readyz = await discovery.client.get("/readyz")
        assert readyz.status_code == 503
        assert "Node list failed" in readyz.json()["reason"]
        response = await discovery.client.get("/v1/fleet")
        assert (response.status_code, response.json()["code"]) == (503, "not_listed_yet")
        assert (
            discovery.sample(
                "rgpu_discovery_apiserver_errors_total", operation="list", code="kube_unavailable"
            )
            >= 1
        )
        sim.faults.clear()
        await discovery.ready()
        fleet = await discovery.fleet()
    assert [s.name for s in fleet.servers] == ["gpu-a"]


async def test_apiserver_down_later_keeps_the_last_fleet(sim, start, build) -> None:
    # No InternalIP: nothing is probed, so only the apiserver could move the revision.
    sim.store.create("nodes", server_node(build, "gpu-a", ip=None))
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 1)
        sim.faults.set_error(rate=1.0, code=500)
        sim.faults.expire_before()
        sim.faults.cut_watches()
        await discovery.counted("rgpu_discovery_apiserver_errors_total", 2)
        still = await discovery.fleet()
        assert (still.revision, still.servers) == (fleet.revision, fleet.servers)
        assert (await discovery.client.get("/readyz")).status_code == 200
        sim.faults.clear()
        sim.store.create("nodes", server_node(build, "gpu-b"))
        await discovery.fleet_when(lambda f: len(f.servers) == 2)


async def test_refused_event_is_counted_and_changes_nothing_else(sim, start, build) -> None:
    sim.faults.set_error(verb="create", resource="events", rate=1.0, code=500)
    sim.store.create("nodes", server_node(build, "gpu-g", annotation="{not json"))
    async with start() as discovery:
        await discovery.counted("rgpu_discovery_node_events_total", 1, outcome="failed")
        fleet = await discovery.fleet()
    assert [s.name for s in fleet.servers] == ["gpu-g"]
    assert sim.store.list("events", namespace="default") == []
