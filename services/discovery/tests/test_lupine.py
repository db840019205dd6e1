"""The probe client against real fake lupine servers of both builds, and against scripted
loopback servers where no fake answers the way a case needs (a 404, garbage, a reset at a
chosen moment); then the usage report's parser on its own."""

from __future__ import annotations

import socket
import struct
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream
from anyio.streams.stapled import StapledByteStream

from rgpu_discovery.lupine import (
    INLINE_PARSE_BYTES,
    MAX_BODY_BYTES,
    LupineProber,
    ProbeOutcome,
    UnreadableUsage,
    busy_gpus,
    split_endpoint,
)
from rgpu_kubesim.lupine import run_lupine

pytestmark = pytest.mark.anyio

GPUS = ("GPU-a0", "GPU-a1", "GPU-a2")
TIMEOUT = 0.3
USAGE_LINE = 'lupine_client_device_memory_used_bytes{{device_uuid="{}"}} 1\n'
H2_SETTINGS = bytes.fromhex("000006040000000000") + bytes.fromhex("000300000064")


def reply(status: str, body: bytes = b"", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return f"HTTP/1.1 {status}\r\nContent-Length: {size}\r\n\r\n".encode() + body


async def probe_real(
    mode: str = "sniff", fault: str | None = None, clients: int = 0
) -> ProbeOutcome:
    async with run_lupine(mode=mode, gpus=GPUS) as lupine, LupineProber(timeout=TIMEOUT) as p:
        for i in range(clients):
            lupine.add_client(f"c{i}", [GPUS[i]], memory_bytes=0 if i else 1 << 20)
        await lupine.set_fault(fault)
        outcome = await p.probe(lupine.endpoint)
        if fault != "down":
            assert lupine.connections == 1
        return outcome


def reset(stream: SocketStream) -> None:
    """Make the coming close an RST, as the released lupine build hangs up."""
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@asynccontextmanager
async def scripted(answer: bytes, ending: str = "close", greet: bool = False):
    """A loopback server that sends ``answer`` (before reading, with ``greet``), then
    ``close``s, ``reset``s or ``hang``s; yields its endpoint."""

    async def serve(stream: SocketStream) -> None:
        async with stream:
            if not greet:
                await stream.receive()
            if answer:
                await stream.send(answer)
            if ending == "reset":
                reset(stream)
            elif ending == "hang":
                await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield f"127.0.0.1:{port}"
        tg.cancel_scope.cancel()


async def probe_scripted(answer: bytes, ending: str = "close", greet: bool = False):
    async with scripted(answer, ending, greet) as endpoint:
        return await LupineProber(timeout=TIMEOUT).probe(endpoint)


async def test_clients_mark_their_gpus_busy_whatever_the_memory() -> None:
    outcome = await probe_real(clients=2)
    assert (outcome.result, outcome.busy) == ("usage", {"GPU-a0", "GPU-a1"})
    assert (outcome.answered, outcome.connections) == (True, 1)


async def test_server_without_clients_reports_empty_usage() -> None:
    outcome = await probe_real()
    assert (outcome.result, outcome.busy) == ("usage", frozenset())


async def test_error_status_is_an_answer_without_usage() -> None:
    outcome = await probe_real(fault="error500", clients=1)
    assert outcome.result == "http_error"
    assert outcome.answered
    assert "500" in outcome.detail


async def test_truncated_body_is_a_bad_body_not_a_dead_server() -> None:
    outcome = await probe_real(fault="truncated", clients=1)
    assert outcome.result == "bad_body"
    assert outcome.answered


async def test_hanging_server_times_out_near_the_timeout() -> None:
    started = time.perf_counter()
    outcome = await probe_real(fault="hang")
    elapsed = time.perf_counter() - started
    assert (outcome.result, outcome.connections) == ("timeout", 1)
    assert not outcome.answered
    assert TIMEOUT * 0.9 <= elapsed < TIMEOUT * 3


async def test_down_server_is_refused_without_a_connection() -> None:
    outcome = await probe_real(fault="down")
    assert (outcome.result, outcome.connections) == ("refused", 0)
    assert not outcome.answered


async def test_released_build_is_alive_from_its_settings_greeting_on_one_connection() -> None:
    outcome = await probe_real(mode="h2only", clients=1)
    assert (outcome.result, outcome.connections) == ("h2_alive", 1)
    assert outcome.answered


async def test_settings_greeting_counts_even_when_sent_before_the_request_is_read() -> None:
    outcome = await probe_scripted(H2_SETTINGS, ending="reset", greet=True)
    assert outcome.result == "h2_alive"


async def test_404_means_the_build_reports_no_usage() -> None:
    outcome = await probe_scripted(reply("404 Not Found", b"404 page not found\n"))
    assert outcome.result == "no_usage"


async def test_reply_received_before_a_reset_is_an_answer() -> None:
    body = USAGE_LINE.format("GPU-1").encode()
    outcome = await probe_scripted(reply("200 OK", body), ending="reset")
    assert (outcome.result, outcome.busy) == ("usage", {"GPU-1"})


async def test_interim_reply_is_skipped_for_the_final_one() -> None:
    outcome = await probe_scripted(b"HTTP/1.1 100 Continue\r\n\r\n" + reply("404 Not Found"))
    assert outcome.result == "no_usage"


@pytest.mark.parametrize("ending", ["close", "reset"])
async def test_hang_up_before_any_byte_is_a_failure(ending: str) -> None:
    outcome = await probe_scripted(b"", ending=ending)
    assert (outcome.result, outcome.connections) == ("unreachable", 1)
    assert "before any reply" in outcome.detail


async def test_reset_in_the_middle_of_the_body_is_a_bad_body() -> None:
    outcome = await probe_scripted(reply("200 OK", b"lupine_", length=100), ending="reset")
    assert outcome.result == "bad_body"


@pytest.mark.parametrize("answer", [b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 abc\r\n\r\n"])
async def test_reply_that_is_neither_http1_nor_http2_is_unreachable(answer: bytes) -> None:
    outcome = await probe_scripted(answer)
    assert outcome.result == "unreachable"


async def test_silent_connected_server_times_out_with_one_connection() -> None:
    outcome = await probe_scripted(b"", ending="hang")
    assert (outcome.result, outcome.connections) == ("timeout", 1)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\xff\xfe not utf-8", "utf-8"),
        (b'lupine_client_device_memory_used_bytes{device_uuid="GPU-1" 1\n', "malformed"),
        (b"#" * (MAX_BODY_BYTES + 1), "larger"),
    ],
)
async def test_unusable_body_is_a_bad_body(body: bytes, why: str) -> None:
    outcome = await probe_scripted(reply("200 OK", body))
    assert outcome.result == "bad_body"
    assert why in outcome.detail


async def test_large_usage_report_is_read_whole() -> None:
    filler = b"# " + b"x" * 78 + b"\n"
    body = filler * (INLINE_PARSE_BYTES // len(filler) + 1) + USAGE_LINE.format("GPU-9").encode()
    outcome = await probe_scripted(reply("200 OK", body))
    assert (outcome.result, outcome.busy) == ("usage", {"GPU-9"})


@pytest.mark.parametrize("endpoint", ["nonsense", "10.0.0.1:", "10.0.0.1:99999", ":80"])
async def test_unusable_endpoint_is_unreachable_without_a_connection(endpoint: str) -> None:
    outcome = await LupineProber(timeout=TIMEOUT).probe(endpoint)
    assert (outcome.result, outcome.connections) == ("unreachable", 0)


def test_ipv6_endpoints_lose_their_brackets() -> None:
    assert split_endpoint("[fd00::1]:14833") == ("fd00::1", 14833)
    assert split_endpoint("10.0.0.1:1") == ("10.0.0.1", 1)


async def test_connection_never_made_times_out_without_a_connection() -> None:
    async def hanging(host: str, port: int) -> StapledByteStream:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    outcome = await LupineProber(timeout=TIMEOUT, dialer=hanging).probe("10.1.2.3:14833")
    assert (outcome.result, outcome.connections) == ("timeout", 0)
    assert outcome.detail == f"no connection within {TIMEOUT} s"


@pytest.mark.parametrize("error", [ConnectionRefusedError, OSError, TimeoutError])
async def test_no_dialer_exception_leaks_out_of_a_probe(error: type[OSError]) -> None:
    async def failing(host: str, port: int) -> StapledByteStream:
        raise error("boom")

    outcome = await LupineProber(timeout=TIMEOUT, dialer=failing).probe("10.1.2.3:14833")
    assert not outcome.answered
    assert outcome.seconds >= 0


def test_sample_body_marks_only_gpus_with_client_memory_lines(shared_fixtures: Path) -> None:
    text = (shared_fixtures / "lupine" / "metrics-sample.txt").read_text()
    assert busy_gpus(text) == {"GPU-7f2c1a9e-0b1d-4e55-9a77-3c2d1e0f9a01"}


def test_zero_value_still_counts_as_busy() -> None:
    text = 'lupine_client_device_memory_used_bytes{client_id="c",device_uuid="GPU-1"} 0\n'
    assert busy_gpus(text) == {"GPU-1"}


def test_empty_body_means_nothing_busy() -> None:
    assert busy_gpus("") == frozenset()


def test_distinct_uuids_across_clients_and_escaped_labels() -> None:
    text = (
        'lupine_client_device_memory_used_bytes{client_id="a\\"b",device_uuid="GPU-1"} 5\n'
        'lupine_client_device_memory_used_bytes{device_uuid="GPU-1",client_id="c\\\\d"} 7\n'
        'lupine_client_device_memory_used_bytes{ device_uuid = "GPU-2" ,} 1\n'
    )
    assert busy_gpus(text) == {"GPU-1", "GPU-2"}


def test_metric_with_longer_name_is_not_usage() -> None:
    text = 'lupine_client_device_memory_used_bytes_total{device_uuid="GPU-1"} 1\n'
    assert busy_gpus(text) == frozenset()


@pytest.mark.parametrize(
    "line",
    [
        'lupine_client_device_memory_used_bytes{device_uuid="GPU-1"',
        'lupine_client_device_memory_used_bytes{client_id="c"} 3',
        "lupine_client_device_memory_used_bytes 3",
        "lupine_client_device_memory_used_bytes{device_uuid=GPU-1} 3",
    ],
)
def test_unreadable_usage_sample_raises_naming_the_line(line: str) -> None:
    with pytest.raises(UnreadableUsage, match="line 2"):
        busy_gpus("# HELP x\n" + line + "\n")
