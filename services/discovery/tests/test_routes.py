"""The HTTP surface: long-poll timing, parameter errors, revision discipline, metrics, gzip
negotiation."""

from __future__ import annotations

import time

import anyio
import pytest

from rgpu_discovery.routes import accepts_gzip

pytestmark = pytest.mark.anyio


def server_node(build, name: str, **overrides):
    args = {"ip": None, "annotation": build.register(build.card("GPU-0"))}
    args.update(overrides)
    return build.node(name, **args)


async def timed_poll(discovery, path: str, since: int, wait: float):
    started = time.perf_counter()
    response = await discovery.client.get(path, params={"since": since, "wait": wait})
    return response, time.perf_counter() - started


async def test_long_poll_answers_within_100ms_of_a_change(sim, start, build) -> None:
    async with start() as discovery:
        fleet = await discovery.fleet()
        answered: list[float] = []

        async def poll() -> None:
            response, _ = await timed_poll(discovery, "/v1/fleet", fleet.revision, 10)
            answered.append(time.perf_counter())
            assert response.json()["servers"][0]["name"] == "gpu-a"

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await anyio.sleep(0.3)
            assert answered == []
            changed = time.perf_counter()
            sim.store.create("nodes", server_node(build, "gpu-a"))
        assert answered[0] - changed < 0.1


async def test_long_poll_without_a_change_waits_the_full_time(start) -> None:
    async with start() as discovery:
        fleet = await discovery.fleet()
        response, elapsed = await timed_poll(discovery, "/v1/fleet", fleet.revision, 0.5)
    assert response.status_code == 200
    assert response.json()["revision"] == fleet.revision
    assert elapsed >= 0.5


async def test_long_poll_from_an_older_revision_answers_at_once(sim, start, build) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a"))
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 1)
        response, elapsed = await timed_poll(discovery, "/v1/fleet", fleet.revision - 1, 30)
    assert response.json()["revision"] == fleet.revision
    assert elapsed < 10  # far below the 30 s the poll would otherwise wait


async def test_relabel_that_changes_nothing_relevant_does_not_move_the_revision(
    sim, start, build
) -> None:
    sim.store.create("nodes", server_node(build, "gpu-a", labels={build.rack: "r1"}))
    sim.store.create("nodes", build.node("node-1", server=None, labels={build.rack: "r1"}))
    async with start() as discovery:
        fleet = await discovery.fleet_when(lambda f: len(f.servers) == 1)
        topology = await discovery.topology()
        for name in ("gpu-a", "node-1"):
            sim.store.patch(
                "nodes",
                name,
                {"metadata": {"labels": {"team": "ml"}, "annotations": {"note": "x"}}},
            )
        response, elapsed = await timed_poll(discovery, "/v1/fleet", fleet.revision, 0.5)
        assert (response.json()["revision"], elapsed >= 0.5) == (fleet.revision, True)
        response, _ = await timed_poll(discovery, "/v1/topology", topology.revision, 0.3)
        assert response.json()["revision"] == topology.revision
        sim.store.patch("nodes", "gpu-a", {"metadata": {"labels": {build.rack: "r2"}}})
        server = await discovery.server_when("gpu-a", lambda s: s.label(build.rack) == "r2")
        assert server.label(build.rack) == "r2"


async def test_topology_long_poll_sees_client_labels_and_new_nodes(sim, start, build) -> None:
    async with start() as discovery:
        topology = await discovery.topology()
        assert topology.nodes == ()
        sim.store.create("nodes", build.node("node-1", server=None, labels={build.zone: "z1"}))
        topology = await discovery.topology(since=topology.revision, wait=5)
        assert topology.labels_of() == {"node-1": {build.zone: "z1"}}
        sim.store.patch("nodes", "node-1", {"metadata": {"labels": {build.zone: "z2"}}})
        topology = await discovery.topology(since=topology.revision, wait=5)
        assert topology.labels_of() == {"node-1": {build.zone: "z2"}}


@pytest.mark.parametrize("path", ["/v1/fleet", "/v1/topology"])
@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ({"since": "x"}, "since"),
        ({"since": "1", "wait": "61"}, "wait"),
        ({"since": "1", "wait": "-1"}, "wait"),
        ({"wait": "1"}, "wait"),
    ],
)
async def test_bad_long_poll_parameter_is_a_400_naming_it(
    start, path: str, query: dict[str, str], parameter: str
) -> None:
    async with start() as discovery:
        response = await discovery.client.get(path, params=query)
    assert response.status_code == 400
    body = response.json()
    assert (body["code"], body["retryable"]) == ("bad_parameter", False)
    assert repr(parameter) in body["message"]


async def test_revision_header_and_health_endpoints(start) -> None:
    async with start() as discovery:
        response = await discovery.client.get("/v1/fleet")
        assert response.headers["x-rgpu-revision"] == str(response.json()["revision"])
        assert (await discovery.client.get("/healthz")).status_code == 200
        assert (await discovery.client.get("/readyz")).status_code == 200


async def test_metrics_expose_fleet_size_and_probe_series(sim, start, build) -> None:
    cards = build.register(build.card("GPU-0"), build.card("GPU-1", 1, health=None))
    sim.store.create("nodes", server_node(build, "gpu-a", annotation=cards, ip="127.0.0.1"))
    sim.store.create("nodes", server_node(build, "gpu-x"))
    sim.store.create("nodes", build.node("node-1", server=None))
    async with start(RGPU_PROBE_INTERVAL_SECONDS="30") as discovery:
        await discovery.fleet_when(lambda f: len(f.servers) == 2)
        text = (await discovery.client.get("/metrics")).text
    assert 'rgpu_discovery_servers{reachable="true",ready="true"} 2.0' in text
    assert 'rgpu_discovery_servers{reachable="false",ready="true"} 0.0' in text
    assert 'rgpu_discovery_cards{busy="false",healthy="true"} 1.0' in text
    assert 'rgpu_discovery_cards{busy="false",healthy="false"} 1.0' in text
    assert "rgpu_discovery_client_nodes 1.0" in text
    assert 'rgpu_discovery_watch_restarts_total{cause="expired"} 0.0' in text
    assert 'rgpu_discovery_probes_total{result="timeout"} 0.0' in text
    assert "rgpu_discovery_probe_duration_seconds_bucket" in text


async def test_large_fleet_is_gzipped_for_clients_that_accept_it(sim, start, build) -> None:
    cards = build.register(*(build.card(f"GPU-{i}", i) for i in range(8)))
    for i in range(20):
        sim.store.create(
            "nodes",
            server_node(build, f"gpu-{i:02d}", annotation=cards, ip="127.0.0.1", server="1"),
        )
    async with start(RGPU_PROBE_INTERVAL_SECONDS="30") as discovery:
        await discovery.fleet_when(lambda f: len(f.servers) == 20)
        zipped = await discovery.client.get("/v1/fleet", headers={"Accept-Encoding": "gzip"})
        plain = await discovery.client.get("/v1/fleet", headers={"Accept-Encoding": "identity"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert int(zipped.headers["content-length"]) * 5 < int(plain.headers["content-length"])
    assert "content-encoding" not in plain.headers
    assert zipped.json() == plain.json()
    assert zipped.headers["vary"] == "Accept-Encoding"


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        (None, False),
        ("", False),
        ("identity", False),
        ("gzip", True),
        ("GZip, deflate, br", True),
        ("deflate, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("*", True),
        ("*;q=0, gzip", True),
        ("gzip;q=0, *", False),
        ("x-gzip", True),
        ("gzip;q=nonsense", True),
    ],
)
def test_gzip_is_used_only_when_the_client_accepts_it(header: str | None, accepted: bool) -> None:
    assert accepts_gzip(header) is accepted
