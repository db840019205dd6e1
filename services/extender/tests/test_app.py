"""The composition root: health, readiness, metrics, listeners and the process entrypoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import anyio
import httpx
import pytest

from rgpu_extender import listeners

pytestmark = [pytest.mark.anyio, pytest.mark.process]


async def test_health_readiness_and_metrics_are_served(extender, build) -> None:
    assert (await extender.client.get("/healthz")).status_code == 200
    assert (await extender.client.get("/readyz")).json() == {"ready": True}
    await extender.client.post("/filter", json=build.filter_args(build.pod(), ["gpu-node-1"]))
    metrics = (await extender.client.get("/metrics")).text
    assert 'rgpu_extender_outcomes_total{outcome="fit",verb="filter"} 1.0' in metrics
    assert 'route="/filter"' in metrics


async def test_verbs_accept_post_only(extender) -> None:
    response = await extender.client.get("/filter")
    assert response.status_code == 405


async def test_a_large_full_nodes_filter_is_not_refused_for_its_size(extender, build) -> None:
    filler = "x" * 4096
    items = [{"metadata": {"name": f"n{i}", "annotations": {"a": filler}}} for i in range(600)]
    body = {"Pod": build.pod(build.container()), "Nodes": {"items": items}, "NodeNames": None}
    response = await extender.client.post("/filter", json=body)
    assert response.status_code == 200
    assert len(response.json()["Nodes"]["items"]) == 600


async def test_full_nodes_past_the_default_limit_need_the_scheduler_body_setting(
    open_extender, build
) -> None:
    filler = "x" * 8192
    items = [{"metadata": {"name": f"n{i}", "annotations": {"a": filler}}} for i in range(600)]
    body = {"Pod": build.pod(build.container()), "Nodes": {"items": items}, "NodeNames": None}
    async with open_extender() as default:
        refused = (await default.client.post("/filter", json=body)).json()
        assert "request body exceeds" in refused["Error"]
    async with open_extender(RGPU_SCHEDULER_MAX_BODY_BYTES=str(16 << 20)) as raised:
        accepted = (await raised.client.post("/filter", json=body)).json()
        assert accepted["Error"] == "" and len(accepted["Nodes"]["items"]) == 600


def test_without_a_certificate_only_the_plain_listener_is_served(build) -> None:
    (plain,) = listeners(build.settings(RGPU_LISTEN="127.0.0.1:9083"))
    assert str(plain.listen) == "127.0.0.1:9083"
    assert plain.ssl_certfile is None


def test_with_a_certificate_the_webhook_listener_serves_its_own_app_over_tls(build) -> None:
    settings = build.settings(
        RGPU_WEBHOOK_LISTEN="0.0.0.0:9443", RGPU_TLS_CERT_FILE="/c.pem", RGPU_TLS_KEY_FILE="/k.pem"
    )
    plain, webhook = listeners(settings)
    assert str(plain.listen) == "127.0.0.1:8083"
    assert (plain.ssl_certfile, plain.client_ca_file) == (None, None)
    assert str(webhook.listen) == "0.0.0.0:9443"
    assert (webhook.ssl_certfile, webhook.ssl_keyfile) == ("/c.pem", "/k.pem")
    assert webhook.face is not None and plain.face is not None


def test_with_a_client_ca_the_scheduler_listener_requires_client_certificates(build) -> None:
    settings = build.settings(
        RGPU_TLS_CERT_FILE="/c.pem",
        RGPU_TLS_KEY_FILE="/k.pem",
        RGPU_SCHEDULER_CLIENT_CA_FILE="/scheduler-ca.pem",
    )
    scheduler, _ = listeners(settings)
    assert (scheduler.ssl_certfile, scheduler.ssl_keyfile) == ("/c.pem", "/k.pem")
    assert scheduler.client_ca_file == "/scheduler-ca.pem"


def test_python_m_with_a_bad_setting_exits_2_naming_the_key() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RGPU_", "OTEL_"))}
    env["RGPU_EXTENDER_BUDGET_SECONDS"] = "soon"
    done = subprocess.run(
        [sys.executable, "-m", "rgpu_extender"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "RGPU_EXTENDER_BUDGET_SECONDS='soon'" in done.stderr
    assert "Traceback" not in done.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_python_m_serves_the_extender_and_stops_on_sigterm(sim) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RGPU_", "OTEL_"))}
    env |= {
        "RGPU_LISTEN": f"127.0.0.1:{port}",
        "RGPU_KUBE_URL": sim.url,
        "RGPU_DISCOVERY_URL": f"http://127.0.0.1:{free_port()}",
        "RGPU_ALLOCATOR_URL": f"http://127.0.0.1:{free_port()}",
        "RGPU_LOG_FORMAT": "text",
    }
    process = await anyio.open_process([sys.executable, "-m", "rgpu_extender"], env=env)
    async with process, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        with anyio.fail_after(20):
            while not await _healthy(client):
                await anyio.sleep(0.05)
        reply = (await client.post("/filter", json={"Pod": {}, "NodeNames": ["a"]})).json()
        assert reply["Error"] == "" and reply["NodeNames"] == ["a"]
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            assert await process.wait() == 0


async def _healthy(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False
