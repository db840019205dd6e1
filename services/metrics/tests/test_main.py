"""``python -m rgpu_metrics`` runs the real service: uvicorn, real sockets, real peers' HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import anyio
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_runtime.serving import Listener, running

pytestmark = [pytest.mark.anyio, pytest.mark.process]


def peer_app(fleet: bytes, claims: bytes) -> Starlette:
    """Discovery and the allocator as plain contract JSON on loopback (no service imported)."""

    def long_poll(body: bytes):
        async def endpoint(request: Request) -> Response:
            if "since" in request.query_params:
                # Held briefly, not for all of ``wait``: uvicorn lets a held request finish
                # before it stops, and the test should not wait for that.
                await anyio.sleep(min(0.2, float(request.query_params["wait"])))
            return Response(body, media_type="application/json")

        return endpoint

    return Starlette(
        routes=[Route("/v1/fleet", long_poll(fleet)), Route("/v1/claims", long_poll(claims))]
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_module_serves_every_card_and_stops_cleanly_on_sigterm(make):
    fleet = make.fleet(make.server("gpu-a", cards=2, busy=[1]), revision=4)
    claims = make.claims(make.claim("gpu-a", [0], state="committed"), revision=2)
    app = peer_app(orjson.dumps(fleet.to_dict()), orjson.dumps(claims.to_dict()))
    async with running(app, Listener(listen="127.0.0.1:0")) as (peer,):
        port = free_port()
        env = {
            **os.environ,
            "RGPU_LISTEN": f"127.0.0.1:{port}",
            "RGPU_DISCOVERY_URL": peer,
            "RGPU_ALLOCATOR_URL": peer,
        }
        process = await anyio.open_process([sys.executable, "-m", "rgpu_metrics"], env=env)
        try:
            text = await scrape_when_ready(f"http://127.0.0.1:{port}")
        finally:
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(20):
                returncode = await process.wait()
            await process.aclose()
    states = {
        (s.labels["card"], s.labels["state"])
        for f in text_string_to_metric_families(text)
        if f.name == "rgpu_card_state"
        for s in f.samples
        if s.value == 1
    }
    assert states == {("gpu-a/GPU-gpu-a-0", "committed"), ("gpu-a/GPU-gpu-a-1", "busy")}
    assert returncode == 0


async def scrape_when_ready(url: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=2.0) as http:
        with anyio.fail_after(30):
            while not await _ready(http):
                await anyio.sleep(0.05)
        response = await http.get("/metrics")
        assert response.status_code == 200
        return response.text


async def _ready(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


def test_a_bad_setting_exits_with_status_2_naming_the_key():
    env = {**os.environ, "RGPU_LISTEN": "not-an-address"}
    done = subprocess.run(
        [sys.executable, "-m", "rgpu_metrics"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "RGPU_LISTEN" in done.stderr
    assert "Traceback" not in done.stderr
