"""Fake lupine: both protocol modes from real clients, every fault, and the /metrics shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import h2.config
import h2.connection
import h2.events
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rgpu_kubesim._lupine_errors import AddressUnavailable, LupineNotFound, SimOptionError
from rgpu_kubesim.errors import KubesimError
from rgpu_kubesim.lupine import FakeLupine, LupineSpec, open_lupine_fleet, run_lupine

pytestmark = pytest.mark.anyio

SAMPLE = Path(__file__).resolve().parents[4] / "fixtures" / "lupine" / "metrics-sample.txt"
GPUS = ("GPU-aaaa-0001", "GPU-aaaa-0002", "GPU-aaaa-0003")
BUSY_METRIC = "lupine_client_device_memory_used_bytes"


@pytest.fixture
def sample_text() -> str:
    return SAMPLE.read_text()


@pytest.fixture
async def lupine() -> AsyncIterator[FakeLupine]:
    async with run_lupine(gpus=GPUS, name="gpu-a") as server:
        yield server


@pytest.fixture
async def old_lupine() -> AsyncIterator[FakeLupine]:
    """The released build: HTTP/2 only, reply then reset."""
    async with run_lupine(gpus=GPUS, mode="h2only") as server:
        yield server


@pytest.fixture
async def clean_old_lupine() -> AsyncIterator[FakeLupine]:
    """HTTP/2 only, but keeping connections and closing cleanly (the fake's old behaviour)."""
    async with run_lupine(gpus=GPUS, mode="h2only", hangup="close") as server:
        yield server


def http1(server: FakeLupine, timeout: float = 2.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://{server.endpoint}", timeout=timeout)


def http2(server: FakeLupine, timeout: float = 2.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://{server.endpoint}", http1=False, http2=True, timeout=timeout
    )


def busy_uuids(text: str) -> set[str]:
    return {
        sample.labels["device_uuid"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == BUSY_METRIC
    }


def shape(text: str) -> list[tuple[str, str, tuple[tuple[str, ...], ...]]]:
    """Family names, types and the label keys of their samples, in order."""
    return [
        (f.name, f.type, tuple(dict.fromkeys(tuple(s.labels) for s in f.samples)))
        for f in text_string_to_metric_families(text)
    ]


async def read_until_reset(stream: anyio.abc.ByteStream) -> tuple[bytes, str]:
    """Everything the server sent, and how it ended: ``reset`` or ``closed`` (clean FIN)."""
    chunks = []
    with anyio.fail_after(2):
        while True:
            try:
                chunks.append(await stream.receive())
            except anyio.EndOfStream:
                return b"".join(chunks), "closed"
            except (anyio.BrokenResourceError, ConnectionResetError):
                return b"".join(chunks), "reset"


def h2_request(method: str, path: str) -> tuple[h2.connection.H2Connection, bytes]:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    headers = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "x")]
    conn.send_headers(1, headers, end_stream=True)
    return conn, conn.data_to_send()


def h2_events(conn: h2.connection.H2Connection, data: bytes) -> list[object]:
    return list(conn.receive_data(data))


async def read_until_closed(stream: anyio.abc.ByteStream) -> bytes:
    chunks = []
    with anyio.fail_after(2):
        try:
            while True:
                chunks.append(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            pass
    return b"".join(chunks)


async def test_sniff_mode_answers_http1_root_with_lupine_banner(lupine: FakeLupine) -> None:
    async with http1(lupine) as client:
        response = await client.get("/")
    assert response.status_code == 200
    assert response.text == "lupine\n"
    assert response.http_version == "HTTP/1.1"


async def test_metrics_mark_busy_exactly_the_gpus_clients_use(lupine: FakeLupine) -> None:
    lupine.add_client("10.0.0.9:pod-a:1:7", [GPUS[0], GPUS[2]], memory_bytes=5)
    lupine.add_client("10.0.0.8:pod-b:1:9", [GPUS[2]], memory_bytes=0)
    async with http1(lupine) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert busy_uuids(response.text) == {GPUS[0], GPUS[2]}


async def test_metrics_have_one_usage_line_per_client_and_gpu(lupine: FakeLupine) -> None:
    lupine.add_client("c1", [GPUS[0], GPUS[1]], memory_bytes=7)
    lupine.add_client("c2", [GPUS[1]], memory_bytes=3)
    families = {f.name: f for f in text_string_to_metric_families(lupine.metrics_text())}
    usage = {
        (s.labels["client_id"], s.labels["device_uuid"]): s.value
        for s in families[BUSY_METRIC].samples
    }
    assert usage == {("c1", GPUS[0]): 7, ("c1", GPUS[1]): 7, ("c2", GPUS[1]): 3}
    used = {
        s.labels["device_uuid"]: s.value
        for s in families["lupine_host_gpu_memory_used_bytes"].samples
    }
    assert used == {GPUS[0]: 7, GPUS[1]: 10, GPUS[2]: 0}


async def test_metrics_have_the_families_and_labels_of_the_real_sample(
    lupine: FakeLupine, sample_text: str
) -> None:
    lupine.add_client("10.0.0.9:pod-a:4026532:7", [GPUS[0]], memory_bytes=83886080)
    assert shape(lupine.metrics_text()) == shape(sample_text)


async def test_metrics_without_clients_report_no_busy_gpu(lupine: FakeLupine) -> None:
    assert busy_uuids(lupine.metrics_text()) == set()
    totals = [
        f
        for f in text_string_to_metric_families(lupine.metrics_text())
        if f.name == "lupine_host_gpu_memory_total_bytes"
    ]
    assert [s.labels["device_uuid"] for s in totals[0].samples] == list(GPUS)


async def test_removed_client_no_longer_marks_its_gpus_busy(lupine: FakeLupine) -> None:
    lupine.add_client("c1", [GPUS[0]])
    lupine.add_client("c2", [GPUS[1]])
    assert busy_uuids(lupine.metrics_text()) == {GPUS[0], GPUS[1]}
    assert lupine.remove_client("c1") is True
    assert lupine.remove_client("c1") is False
    assert busy_uuids(lupine.metrics_text()) == {GPUS[1]}
    assert set(lupine.clients) == {"c2"}


async def test_label_values_with_quotes_and_newlines_round_trip(lupine: FakeLupine) -> None:
    odd = 'pod "x"\\\nline'
    lupine.add_client(odd, [GPUS[0]])
    families = text_string_to_metric_families(lupine.metrics_text())
    ids = {s.labels["client_id"] for f in families for s in f.samples if s.name == BUSY_METRIC}
    assert ids == {odd}


@pytest.mark.parametrize(
    ("method", "path"), [("HEAD", "/metrics"), ("GET", "/nope"), ("POST", "/"), ("HEAD", "/")]
)
async def test_http1_other_methods_and_paths_get_404(
    lupine: FakeLupine, method: str, path: str
) -> None:
    async with http1(lupine) as client:
        response = await client.request(method, path)
    assert response.status_code == 404


async def test_http1_keeps_the_connection_alive_between_requests(lupine: FakeLupine) -> None:
    request = f"GET / HTTP/1.1\r\nHost: {lupine.endpoint}\r\n\r\n".encode()
    async with await anyio.connect_tcp(lupine.host, lupine.port) as stream:
        for _ in range(2):
            await stream.send(request)
            with anyio.fail_after(2):
                reply = await stream.receive()
            assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
            assert reply.endswith(b"\r\n\r\nlupine\n")


async def test_http1_answers_pipelined_requests_in_order_and_honours_close(
    lupine: FakeLupine,
) -> None:
    requests = b"GET /nope HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nConnection: close\r\n\r\n"
    async with await anyio.connect_tcp(lupine.host, lupine.port) as stream:
        await stream.send(requests)
        replies = await read_until_closed(stream)
    assert replies.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert replies.count(b"HTTP/1.1 ") == 2
    assert replies.endswith(b"Connection: close\r\n\r\nlupine\n")


async def test_http1_request_body_is_skipped_not_read_as_a_request(lupine: FakeLupine) -> None:
    requests = b"POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nGET /GET / HTTP/1.1\r\n\r\n"
    async with await anyio.connect_tcp(lupine.host, lupine.port) as stream:
        await stream.send(requests + b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        replies = await read_until_closed(stream)
    assert replies.count(b"HTTP/1.1 404") == 1
    assert replies.count(b"HTTP/1.1 200") == 2


async def test_malformed_http1_request_gets_400_and_close(lupine: FakeLupine) -> None:
    async with await anyio.connect_tcp(lupine.host, lupine.port) as stream:
        await stream.send(b"NONSENSE\r\n\r\n")
        reply = await read_until_closed(stream)
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n")


async def test_sniff_mode_answers_h2_prior_knowledge_head_with_cuda_version(
    lupine: FakeLupine,
) -> None:
    async with http2(lupine) as client:
        response = await client.head("/")
    assert response.http_version == "HTTP/2"
    assert response.status_code == 200
    assert response.headers["x-lupine-cuda-version"] == "12.4"


async def test_h2_other_paths_get_404(lupine: FakeLupine) -> None:
    async with http2(lupine) as client:
        response = await client.get("/metrics")
    assert response.status_code == 404


async def test_h2_works_with_the_h2_library_over_a_raw_socket(
    clean_old_lupine: FakeLupine,
) -> None:
    old_lupine = clean_old_lupine
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    headers = [(":method", "HEAD"), (":path", "/"), (":scheme", "http"), (":authority", "x")]
    conn.send_headers(1, headers, end_stream=True)
    async with await anyio.connect_tcp(old_lupine.host, old_lupine.port) as stream:
        await stream.send(conn.data_to_send())
        response = await _receive_response(conn, stream)
    assert response[":status"] == "200"
    assert response["x-lupine-cuda-version"] == "12.4"


async def _receive_response(
    conn: h2.connection.H2Connection, stream: anyio.abc.ByteStream
) -> dict[str, str]:
    with anyio.fail_after(2):
        while True:
            for event in conn.receive_data(await stream.receive()):
                if isinstance(event, h2.events.ResponseReceived):
                    return {k.decode(): v.decode() for k, v in event.headers}
            await stream.send(conn.data_to_send())


@pytest.mark.parametrize(("hangup", "ending"), [("reset", "reset"), ("close", "closed")])
async def test_h2only_mode_greets_http1_with_settings_then_hangs_up(
    hangup: str, ending: str
) -> None:
    async with (
        run_lupine(gpus=GPUS, mode="h2only", hangup=hangup) as old_lupine,
        await anyio.connect_tcp(old_lupine.host, old_lupine.port) as stream,
    ):
        await stream.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data, how = await read_until_reset(stream)
    assert len(data) >= 9
    assert data[3] == 0x04  # frame type SETTINGS
    assert int.from_bytes(data[5:9], "big") == 0  # on the connection stream
    assert how == ending


@pytest.mark.parametrize(("method", "path"), [("HEAD", "/"), ("GET", "/metrics"), ("POST", "/x")])
async def test_released_build_answers_any_h2_request_with_200_and_its_cuda_version_then_resets(
    old_lupine: FakeLupine, method: str, path: str
) -> None:
    conn, request = h2_request(method, path)
    async with await anyio.connect_tcp(old_lupine.host, old_lupine.port) as stream:
        await stream.send(request)
        data, how = await read_until_reset(stream)
    responses = [e for e in h2_events(conn, data) if isinstance(e, h2.events.ResponseReceived)]
    version = b"x-lupine-cuda-version"
    assert [dict(r.headers) for r in responses] == [{b":status": b"200", version: b"12.4"}]
    assert how == "reset"


async def test_released_build_counts_one_connection_per_accept(old_lupine: FakeLupine) -> None:
    for _ in range(3):
        async with await anyio.connect_tcp(old_lupine.host, old_lupine.port) as stream:
            await stream.send(b"GET / HTTP/1.1\r\n\r\n")
            await read_until_reset(stream)
    assert old_lupine.connections == 3
    assert (old_lupine.mode, old_lupine.hangup) == ("h2only", "reset")


async def test_h2only_mode_fails_an_http1_client(old_lupine: FakeLupine) -> None:
    async with http1(old_lupine) as client:
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await client.get("/metrics")


async def test_h2only_close_mode_answers_h2_prior_knowledge_head(
    clean_old_lupine: FakeLupine,
) -> None:
    old_lupine = clean_old_lupine
    async with http2(old_lupine) as client:
        response = await client.head("/")
    assert response.status_code == 200
    assert "x-lupine-cuda-version" in response.headers


async def test_down_fault_refuses_connections_until_cleared(lupine: FakeLupine) -> None:
    port = lupine.port
    await lupine.set_fault("down")
    async with http1(lupine) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("/")
    await lupine.set_fault(None)
    assert lupine.port == port
    async with http1(lupine) as client:
        assert (await client.get("/")).status_code == 200


async def test_down_fault_resets_open_keep_alive_connections(lupine: FakeLupine) -> None:
    async with await anyio.connect_tcp(lupine.host, lupine.port) as stream:
        await stream.send(b"GET / HTTP/1.1\r\n\r\n")
        with anyio.fail_after(2):
            await stream.receive()
        await lupine.set_fault("down")
        assert await read_until_closed(stream) == b""


async def test_hang_fault_accepts_but_never_answers(lupine: FakeLupine) -> None:
    await lupine.set_fault("hang")
    async with http1(lupine, timeout=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get("/metrics")


async def test_hang_fault_also_stalls_h2_probes(lupine: FakeLupine) -> None:
    await lupine.set_fault("hang")
    async with http2(lupine, timeout=0.3) as client:
        with pytest.raises(httpx.TimeoutException):
            await client.head("/")


async def test_error500_fault_fails_metrics_but_not_the_banner(lupine: FakeLupine) -> None:
    await lupine.set_fault("error500")
    async with http1(lupine) as client:
        assert (await client.get("/metrics")).status_code == 500
        assert (await client.get("/")).status_code == 200
    await lupine.set_fault(None)
    async with http1(lupine) as client:
        assert (await client.get("/metrics")).status_code == 200


async def test_truncated_fault_makes_httpx_raise_on_the_short_body(lupine: FakeLupine) -> None:
    lupine.add_client("c1", [GPUS[0]])
    await lupine.set_fault("truncated")
    async with http1(lupine) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/metrics")


async def test_fault_set_on_an_open_connection_applies_to_its_next_request(
    lupine: FakeLupine,
) -> None:
    async with http1(lupine) as client:
        assert (await client.get("/metrics")).status_code == 200
        await lupine.set_fault("error500")
        assert (await client.get("/metrics")).status_code == 500


async def test_fleet_finds_servers_by_name_and_endpoint_and_closes_them_all() -> None:
    async with open_lupine_fleet() as fleet:
        a = await fleet.start(LupineSpec(name="gpu-a", gpus=("GPU-1",)))
        b = await fleet.start(LupineSpec(name="gpu-b", gpus=("GPU-2",), mode="h2only"))
        assert fleet.by_name("gpu-b") is b
        assert fleet.by_endpoint(a.endpoint) is a
        assert fleet.get("127.0.0.1:1") is None
        assert list(fleet) == [a, b]
        with pytest.raises(LupineNotFound):
            fleet.by_endpoint("127.0.0.1:1")
        with pytest.raises(SimOptionError, match="gpu-a"):
            await fleet.start(LupineSpec(name="gpu-a"))
    async with http1(a) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("/")


async def test_busy_port_raises_address_unavailable_not_oserror(lupine: FakeLupine) -> None:
    with pytest.raises(AddressUnavailable, match=lupine.endpoint) as caught:
        async with run_lupine(port=lupine.port):
            pass
    assert isinstance(caught.value, KubesimError)
    assert isinstance(caught.value.__cause__, OSError)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "h3"}, "mode"),
        ({"hangup": "fin"}, "hangup"),
        ({"host": "localhost"}, "host"),
        ({"port": 70000}, "port"),
        ({"gpus": ("GPU-1", "GPU-1")}, "gpus"),
        ({"gpu_memory_bytes": 0}, "gpu_memory_bytes"),
    ],
)
async def test_bad_server_options_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(SimOptionError) as caught:
        async with run_lupine(**kwargs):  # type: ignore[arg-type]
            pass
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        (("c", ["GPU-nope"]), {}, "gpu_uuids"),
        (("c", GPUS[0]), {}, "gpu_uuids"),
        (("", [GPUS[0]]), {}, "client_id"),
        (("c", [GPUS[0]]), {"memory_bytes": -1}, "memory_bytes"),
        (("c", [GPUS[0]]), {"utilization_percent": 101}, "utilization_percent"),
    ],
)
async def test_bad_client_arguments_name_the_field(
    lupine: FakeLupine, args: tuple[object, ...], kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(SimOptionError) as caught:
        lupine.add_client(*args, **kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert lupine.clients == {}


async def test_unknown_fault_is_refused_and_the_old_one_kept(lupine: FakeLupine) -> None:
    await lupine.set_fault("error500")
    with pytest.raises(SimOptionError, match="down, hang, error500, truncated"):
        await lupine.set_fault("slow")
    assert lupine.fault == "error500"
