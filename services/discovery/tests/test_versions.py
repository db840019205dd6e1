"""lupine's CUDA version: asked over HTTP/2 ``HEAD /`` the way the released build can answer,
rarely, and shown in the fleet; and what a hostile or broken port does to the question."""

from __future__ import annotations

import json

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketStream

from rgpu_contracts import ServerName
from rgpu_contracts.instances import ANNOTATION_INSTANCES
from rgpu_discovery.fleet import FleetState
from rgpu_discovery.lupine import ProbeOutcome, dial_tcp
from rgpu_discovery.lupine_version import VersionAnswer, ask_cuda_version
from rgpu_discovery.probe_states import ProbeState, StampedState
from rgpu_discovery.versions import Versions
from rgpu_kubesim.lupine import LupineSpec, open_lupine_fleet, run_lupine

pytestmark = pytest.mark.anyio

GPUS = ("GPU-0", "GPU-1")


@pytest.mark.parametrize(
    ("mode", "hangup"), [("h2only", "reset"), ("h2only", "close"), ("sniff", "reset")]
)
async def test_every_lupine_build_tells_its_cuda_version(mode: str, hangup: str) -> None:
    async with run_lupine(gpus=GPUS, mode=mode, hangup=hangup, cuda_version="12.2") as lupine:
        answer = await ask_cuda_version(lupine.endpoint, dialer=dial_tcp, timeout=2.0)
    assert answer == VersionAnswer(version="12.2", connections=1)
    assert lupine.connections == 1


async def _serving(reply: bytes):
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")

    async def serve(stream: SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(reply)

    return listener, serve


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 reply"),
        (b"", "closed before the reply"),
        (b"\x00" * 70_000, "not an HTTP/2 reply"),
    ],
)
async def test_a_port_that_is_not_lupine_gets_no_version_and_a_reason(reply, said) -> None:
    listener, serve = await _serving(reply)
    port = listener.extra(SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        answer = await ask_cuda_version(f"127.0.0.1:{port}", dialer=dial_tcp, timeout=2.0)
        tg.cancel_scope.cancel()
    assert answer.version is None and said in answer.detail
    assert answer.connections == 1


async def test_a_server_that_never_answers_costs_one_bounded_question() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(SocketAttribute.local_port)

    async def silent(stream: SocketStream) -> None:
        async with stream:
            await anyio.sleep_forever()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, silent)
        with anyio.fail_after(2):
            answer = await ask_cuda_version(f"127.0.0.1:{port}", dialer=dial_tcp, timeout=0.2)
        tg.cancel_scope.cancel()
    assert answer == VersionAnswer(
        version=None, detail="no answer within the timeout", connections=1
    )


async def test_nothing_listening_is_no_connection() -> None:
    async with run_lupine(gpus=GPUS) as lupine:
        endpoint = lupine.endpoint
    answer = await ask_cuda_version(endpoint, dialer=dial_tcp, timeout=1.0)
    assert (answer.version, answer.connections) == (None, 0)


def _h2_reply(headers: list[tuple[bytes, bytes]]) -> bytes:
    import h2.config
    import h2.connection

    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(
        1,
        [(":method", "HEAD"), (":path", "/"), (":scheme", "http"), (":authority", "x")],
        end_stream=True,
    )
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(b":status", b"200"), *headers], end_stream=True)
    return server.data_to_send()


@pytest.mark.parametrize(
    ("headers", "version"),
    [
        ([(b"x-lupine-cuda-version", b"12.4.1")], "12.4.1"),
        ([], None),
        ([(b"x-lupine-cuda-version", b"12.4; rm -rf /")], None),
        ([(b"x-lupine-cuda-version", b"1" * 200)], None),
    ],
)
async def test_only_a_version_shaped_header_is_believed(headers, version) -> None:
    listener, serve = await _serving(_h2_reply(headers))
    port = listener.extra(SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        answer = await ask_cuda_version(f"127.0.0.1:{port}", dialer=dial_tcp, timeout=2.0)
        tg.cancel_scope.cancel()
    assert answer.version == version


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_version_is_asked_first_then_after_a_reconnect_else_once_per_interval() -> None:
    fleet, clock, asked = FleetState(default_port=14833), _Clock(), []

    async def ask(endpoint: str) -> VersionAnswer:
        asked.append(endpoint)
        return VersionAnswer(version="12.4", connections=1)

    versions = Versions(fleet=fleet, ask=ask, interval=300.0, clock=clock)
    alive = ProbeOutcome(result="h2_alive", connections=1)
    server = ServerName("gpu-a")
    first = await versions.after_probe(server, "10.0.0.1:1", alive)
    assert (first.cuda_version, first.connections) == ("12.4", 2)
    clock.now = 299.0
    assert (await versions.after_probe(server, "10.0.0.1:1", alive)).cuda_version is None
    dead = ProbeOutcome(result="refused")
    assert await versions.after_probe(server, "10.0.0.1:1", dead) == dead
    fleet.apply_states([_state(server, reachable=False)])
    assert (await versions.after_probe(server, "10.0.0.1:1", alive)).cuda_version == "12.4"
    clock.now = 700.0
    assert (await versions.after_probe(server, "10.0.0.2:1", alive)).cuda_version == "12.4"
    assert asked == ["10.0.0.1:1", "10.0.0.1:1", "10.0.0.2:1"]


def _state(server: ServerName, *, reachable: bool) -> StampedState:
    probe = ProbeState(reachable=reachable, failures=0 if reachable else 2, probed=True)
    return StampedState(
        server=server,
        endpoint="10.0.0.1:1",
        probe=probe,
        version="5",
        since=5,
        renewed_at=0.0,
        holder="x",
    )


def test_a_state_keeps_its_version_until_an_answer_brings_another() -> None:
    state = ProbeState().after(ProbeOutcome(result="h2_alive", cuda_version="12.4"))
    assert state.after(ProbeOutcome(result="refused")).cuda_version == "12.4"
    assert state.after(ProbeOutcome(result="usage")).cuda_version == "12.4"
    assert not state.same_for_fleet(state.after(ProbeOutcome(result="usage", cuda_version="13.0")))


async def test_the_fleet_shows_each_server_s_cuda_version_and_asks_it_once_at_rest(
    sim, start, build
) -> None:
    async with open_lupine_fleet() as fakes, start() as discovery:
        old = await fakes.start(
            LupineSpec(name="gpu-old", mode="h2only", gpus=GPUS, cuda_version="11.8")
        )
        new = await fakes.start(LupineSpec(name="gpu-new", gpus=GPUS, cuda_version="12.4"))
        for lupine in (old, new):
            cards = build.register(*(build.card(g, i) for i, g in enumerate(GPUS)))
            node = build.node(
                lupine.name, server=str(lupine.port), ip="127.0.0.1", annotation=cards
            )
            sim.store.create("nodes", node)
        await discovery.server_when("gpu-old", lambda s: s.cuda_version == "11.8")
        await discovery.server_when("gpu-new", lambda s: s.cuda_version == "12.4")
        await discovery.counted("rgpu_discovery_probes_total", 10)
    assert discovery.sample("rgpu_discovery_version_queries_total", result="answered") == 2


async def test_each_lupine_instance_is_probed_on_its_own_port_with_its_own_state(
    sim, start, build
) -> None:
    async with open_lupine_fleet() as fakes, start() as discovery:
        first = await fakes.start(LupineSpec(gpus=("GPU-0",), cuda_version="12.4"))
        second = await fakes.start(LupineSpec(gpus=("GPU-1",), cuda_version="12.4"))
        second.add_client("pod-x", ["GPU-1"])
        cards = build.register(*(build.card(g, i) for i, g in enumerate(GPUS)))
        node = build.node("gpu-a", ip="127.0.0.1", annotation=cards)
        node["metadata"]["annotations"][ANNOTATION_INSTANCES] = json.dumps(
            [{"port": first.port, "gpus": ["GPU-0"]}, {"port": second.port, "gpus": ["GPU-1"]}]
        )
        sim.store.create("nodes", node)
        one = await discovery.server_when(f"gpu-a@{first.port}", lambda s: s.usage_reported)
        two = await discovery.server_when(f"gpu-a@{second.port}", lambda s: s.busy == {"GPU-1"})
        await first.set_fault("down")
        await discovery.server_when(f"gpu-a@{first.port}", lambda s: not s.reachable)
        still = await discovery.server_when(f"gpu-a@{second.port}", lambda s: s.reachable)
    assert one.busy == frozenset() and one.cuda_version == "12.4"
    assert two.node == "gpu-a" and still.busy == {"GPU-1"}
    leases = sim.store.list("leases", namespace="rgpu-system")
    probed = sorted(
        item["metadata"]["annotations"]["rgpu.io/probed-server"]
        for item in leases
        if "rgpu.io/probed-server" in (item["metadata"].get("annotations") or {})
    )
    assert probed == sorted([f"gpu-a@{first.port}", f"gpu-a@{second.port}"])
    assert all("@" not in item["metadata"]["name"] for item in leases)
