"""Fake lupine under uvloop, the loop ``python -m rgpu_kubesim serve`` runs on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from rgpu_kubesim.lupine import FakeLupine, run_lupine

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"use_uvloop": True})


@pytest.fixture(params=["sniff", "h2only"])
async def lupine(request: pytest.FixtureRequest) -> AsyncIterator[FakeLupine]:
    mode = request.param
    async with run_lupine(gpus=("GPU-1", "GPU-2"), mode=mode, hangup="close") as server:
        yield server


async def test_released_build_resets_after_the_settings_greeting_under_uvloop() -> None:
    async with (
        run_lupine(gpus=("GPU-1",), mode="h2only") as lupine,
        await anyio.connect_tcp(lupine.host, lupine.port) as stream,
    ):
        await stream.send(b"GET /metrics HTTP/1.1\r\n\r\n")
        data = b""
        reset = (anyio.BrokenResourceError, ConnectionResetError)
        with anyio.fail_after(2), pytest.raises(reset):  # noqa: PT012
            while True:
                data += await stream.receive()
    assert data[3] == 0x04  # SETTINGS
    assert lupine.connections == 1


async def test_h2_prior_knowledge_head_answers_under_uvloop(lupine: FakeLupine) -> None:
    async with httpx.AsyncClient(http1=False, http2=True) as client:
        response = await client.head(f"http://{lupine.endpoint}/")
    assert response.headers["x-lupine-cuda-version"] == "12.4"


async def test_metrics_and_faults_work_under_uvloop() -> None:
    async with run_lupine(gpus=("GPU-1", "GPU-2")) as lupine, httpx.AsyncClient() as client:
        lupine.add_client("c", ["GPU-2"])
        assert 'device_uuid="GPU-2"' in (await client.get(f"http://{lupine.endpoint}/metrics")).text
        await lupine.set_fault("truncated")
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(f"http://{lupine.endpoint}/metrics")
        await lupine.set_fault("down")
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://{lupine.endpoint}/")
        await lupine.set_fault(None)
        assert (await client.get(f"http://{lupine.endpoint}/")).status_code == 200
