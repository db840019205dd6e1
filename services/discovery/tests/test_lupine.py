"""The probe client against real fake lupine servers (and a MockTransport where no fake can
answer the way a case needs)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from rgpu_discovery.lupine import MAX_BODY_BYTES, LupineProber
from rgpu_kubesim.lupine import run_lupine

pytestmark = pytest.mark.anyio

GPUS = ("GPU-a0", "GPU-a1", "GPU-a2")
TIMEOUT = 0.3


async def probe_real(mode: str = "sniff", fault: str | None = None, clients: int = 0):
    async with run_lupine(mode=mode, gpus=GPUS) as lupine, LupineProber(timeout=TIMEOUT) as p:
        for i in range(clients):
            lupine.add_client(f"c{i}", [GPUS[i]], memory_bytes=0 if i else 1 << 20)
        await lupine.set_fault(fault)
        return await p.probe(lupine.endpoint)


async def probe_mock(handler: Callable[[httpx.Request], httpx.Response]):
    async with LupineProber(timeout=TIMEOUT, transport=httpx.MockTransport(handler)) as p:
        return await p.probe("10.1.2.3:14833")


async def test_clients_mark_their_gpus_busy_whatever_the_memory() -> None:
    outcome = await probe_real(clients=2)
    assert (outcome.result, outcome.busy) == ("usage", {"GPU-a0", "GPU-a1"})
    assert outcome.answered


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
    assert outcome.result == "timeout"
    assert not outcome.answered
    assert TIMEOUT * 0.9 <= elapsed < TIMEOUT * 3


async def test_down_server_is_refused() -> None:
    outcome = await probe_real(fault="down")
    assert outcome.result == "refused"
    assert not outcome.answered


async def test_h2only_server_is_alive_through_http2_prior_knowledge() -> None:
    outcome = await probe_real(mode="h2only", clients=1)
    assert outcome.result == "h2_alive"
    assert outcome.answered


async def test_404_means_the_build_reports_no_usage() -> None:
    outcome = await probe_mock(lambda request: httpx.Response(404, text="404 page not found"))
    assert outcome.result == "no_usage"


async def test_neither_protocol_answering_is_unreachable() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("illegal status line", request=request)

    outcome = await probe_mock(broken)
    assert outcome.result == "unreachable"
    assert "HTTP/2" in outcome.detail


async def test_http1_protocol_failure_falls_back_to_http2_head() -> None:
    seen: list[tuple[str, str]] = []

    def old_build(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        if request.method == "GET":
            raise httpx.RemoteProtocolError("illegal status line", request=request)
        return httpx.Response(200)

    outcome = await probe_mock(old_build)
    assert (outcome.result, seen) == ("h2_alive", [("GET", "/metrics"), ("HEAD", "/")])


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\xff\xfe not utf-8", "utf-8"),
        (b'lupine_client_device_memory_used_bytes{device_uuid="GPU-1" 1\n', "malformed"),
        (b"#" * (MAX_BODY_BYTES + 1), "larger"),
    ],
)
async def test_unusable_body_is_a_bad_body(body: bytes, why: str) -> None:
    outcome = await probe_mock(lambda request: httpx.Response(200, content=body))
    assert outcome.result == "bad_body"
    assert why in outcome.detail


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectTimeout,
        httpx.ReadTimeout,
        httpx.ConnectError,
        httpx.ReadError,
        httpx.WriteError,
        httpx.ProxyError,
        httpx.UnsupportedProtocol,
        httpx.DecodingError,
    ],
)
async def test_no_httpx_exception_leaks_out_of_a_probe(error: type[httpx.HTTPError]) -> None:
    def failing(request: httpx.Request) -> httpx.Response:
        raise error("boom", request=request)

    outcome = await probe_mock(failing)
    assert not outcome.answered
    assert outcome.seconds >= 0
