"""Attacks on the extender's listeners themselves, over real sockets: floods of headers and of
connections, reviews too large or too crowded to be a pod, large reviews sent in parallel, and a
webhook that answers only the apiserver's client certificate. Each must be refused cheaply while
an honest review from the same address still gets its answer.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
import trustme

from rgpu_extender.reviewshape import MAX_POD_CONTAINERS, MAX_REVIEW_VALUES
from rgpu_extender.webhookguard import (
    LARGE_PER_CLIENT,
    LARGE_PER_LISTENER,
    LARGE_REVIEW_BYTES,
    TURNS_PER_CLIENT,
    WAIT_SECONDS,
    Busy,
    Turns,
)

pytestmark = pytest.mark.anyio

Json = dict[str, Any]


def trusting(ca: trustme.CA, client: trustme.LeafCert | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if client is not None:
        client.configure_cert(context)
    return context


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def exchange(port: int, payload: bytes, context: ssl.SSLContext | None = None) -> bytes:
    """Send ``payload`` (in a thread, apart from the server's loop) and read until closed."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with raw if context is None else context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        with suppress(OSError):
            sock.sendall(payload)
        received = b""
        with suppress(OSError):
            while chunk := sock.recv(65536):
                received += chunk
        return received


async def mutate(url: str, ca: trustme.CA, body: bytes, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(verify=trusting(ca), trust_env=False, timeout=30) as client:
        return await client.post(f"{url}/mutate", content=body, headers=headers)


# -- reviews refused by shape ---------------------------------------------------------------------


async def test_a_review_of_a_pod_with_1_5_million_containers_is_denied_before_decoding(
    serve_extender, ca, build
) -> None:
    crowd = build.review(build.pod(*([{}] * 1_500_000)))
    body = orjson.dumps(crowd)
    assert len(body) > 4 << 20
    async with serve_extender() as (_, webhook):
        reply = await mutate(webhook, ca, body)
        assert reply.status_code == 200
        response = reply.json()["response"]
        assert response["uid"] == crowd["request"]["uid"] and response["allowed"] is False
        assert response["status"]["code"] == 400
        assert (
            f"more than the {MAX_REVIEW_VALUES} the webhook decodes"
            in (response["status"]["message"])
        )
        honest = await mutate(webhook, ca, orjson.dumps(build.review(build.pod())))
        assert honest.json()["response"]["allowed"] is True


async def test_a_review_too_large_to_decode_without_a_readable_uid_is_a_400(
    serve_extender, ca
) -> None:
    body = b'{"padding": [' + b"1," * (MAX_REVIEW_VALUES + 10) + b'1], "request": {}}'
    async with serve_extender() as (_, webhook):
        reply = await mutate(webhook, ca, body)
        assert reply.status_code == 400
        assert "JSON values" in reply.json()["message"]


async def test_a_pod_with_more_containers_than_the_bound_is_denied_naming_the_count(
    serve_extender, ca, build
) -> None:
    many = [build.container(f"c{i}") for i in range(MAX_POD_CONTAINERS + 1)]
    async with serve_extender() as (_, webhook):
        reply = await mutate(webhook, ca, orjson.dumps(build.review(build.pod(*many))))
        status = reply.json()["response"]["status"]
        assert status["code"] == 400
        assert status["message"].startswith(
            f"request.object.spec: lists {MAX_POD_CONTAINERS + 1} containers"
        )


# -- large reviews, rationed per client address and per listener ---------------------------------


@asynccontextmanager
async def held_large_reviews(port: int, ca: trustme.CA, sources: list[str]) -> AsyncIterator[None]:
    """Connections that each declare a large review and send only part of it, holding it in
    flight until the block ends (opened in a thread: the handshakes need the server's loop)."""
    context = trusting(ca)
    head = (
        b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (LARGE_REVIEW_BYTES * 4)
    )

    def hold(source: str) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
        sock.sendall(head + b"{" + b" " * 1024)
        return sock

    socks = []
    try:
        for source in sources:
            socks.append(await anyio.to_thread.run_sync(hold, source))
        yield
    finally:
        for sock in socks:
            sock.close()


async def test_large_reviews_beyond_one_addresss_allowance_get_429_while_small_ones_pass(
    serve_extender, ca, build
) -> None:
    large = orjson.dumps(build.review(build.pod(annotations={"pad": "x" * LARGE_REVIEW_BYTES})))
    async with serve_extender() as (_, webhook):
        port = port_of(webhook)
        sources = ["127.0.0.1"] * LARGE_PER_CLIENT
        async with held_large_reviews(port, ca, sources):
            await anyio.sleep(0.3)
            refused = await mutate(webhook, ca, large)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            assert "large AdmissionReviews in flight" in refused.json()["message"]
            honest = await mutate(webhook, ca, orjson.dumps(build.review(build.pod())))
            assert honest.status_code == 200 and honest.json()["response"]["allowed"] is True
        after = await mutate(webhook, ca, large)
        assert after.status_code == 200 and after.json()["response"]["allowed"] is True


async def test_large_reviews_beyond_the_listeners_allowance_get_429_from_any_address(
    serve_extender, ca, build
) -> None:
    large = orjson.dumps(build.review(build.pod(annotations={"pad": "x" * LARGE_REVIEW_BYTES})))
    sources = [f"127.0.0.{2 + n}" for n in range(LARGE_PER_LISTENER)]
    async with (
        serve_extender() as (_, webhook),
        held_large_reviews(port_of(webhook), ca, sources),
    ):
        await anyio.sleep(0.3)
        refused = await mutate(webhook, ca, large)
        assert refused.status_code == 429
        assert "is handling" in refused.json()["message"]


# -- the request head and the connections ---------------------------------------------------------


@pytest.mark.parametrize("listener", ["scheduler", "webhook"])
async def test_a_16_mib_header_flood_is_refused_on_both_listeners(
    serve_extender, ca, listener: str
) -> None:
    flood = b"GET /readyz HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (16 << 20) + b"\r\n\r\n"
    async with serve_extender() as (scheduler, webhook):
        url, context = (scheduler, None) if listener == "scheduler" else (webhook, trusting(ca))
        reply = await anyio.to_thread.run_sync(exchange, port_of(url), flood, context)
        assert reply == b"" or reply.startswith(b"HTTP/1.1 431 ")
        async with httpx.AsyncClient(verify=trusting(ca), trust_env=False) as client:
            assert (await client.get(f"{url}/readyz")).status_code == 200
            text = (await client.get(f"{scheduler}/metrics")).text
        assert f'rgpu_http_rejected_total{{listener="{listener}",reason="header_bytes"}} 1.0' in (
            text
        )


async def test_connections_beyond_one_addresss_cap_are_closed_before_tls(
    serve_extender, ca, build
) -> None:
    env = {"RGPU_HTTP_MAX_CLIENT_CONNECTIONS": "20", "RGPU_HTTP_HEADER_SECONDS": "3"}
    async with serve_extender(**env) as (scheduler, webhook):
        port = port_of(webhook)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        try:
            await anyio.sleep(0.2)
            # The 21st from the same address: closed at once, without a handshake.
            with pytest.raises((ssl.SSLError, OSError)):
                await anyio.to_thread.run_sync(exchange, port, b"", trusting(ca))
            # Another address still gets its review answered.
            review = orjson.dumps(build.review(build.pod()))
            request = (
                b"POST /mutate HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(review)
            ) + review
            answered = await anyio.to_thread.run_sync(
                lambda: exchange_from("127.0.0.2", port, request, trusting(ca))
            )
            assert answered.startswith(b"HTTP/1.1 200 ")
        finally:
            for sock in held:
                sock.close()
        async with httpx.AsyncClient(trust_env=False) as client:
            text = (await client.get(f"{scheduler}/metrics")).text
        assert 'rgpu_http_rejected_total{listener="webhook",reason="client_connections"} 1.0' in (
            text
        )


def exchange_from(source: str, port: int, payload: bytes, context: ssl.SSLContext) -> bytes:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(payload)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


# -- the apiserver's client certificate ------------------------------------------------------------


@pytest.fixture(scope="module")
def apiserver_ca() -> trustme.CA:
    """The CA that signs the apiserver's client certificate for webhooks."""
    return trustme.CA()


@pytest.fixture
def apiserver_ca_file(apiserver_ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "apiserver-ca.crt"
    apiserver_ca.cert_pem.write_to_path(path)
    return str(path)


async def test_with_a_webhook_client_ca_only_the_apiservers_certificate_may_send_reviews(
    serve_extender, ca, apiserver_ca, apiserver_ca_file, build
) -> None:
    review = build.review(build.pod())
    apiserver = apiserver_ca.issue_cert("kube-apiserver")
    stranger = trustme.CA().issue_cert("kube-apiserver")
    async with serve_extender(RGPU_WEBHOOK_CLIENT_CA_FILE=apiserver_ca_file) as (_, webhook):
        async with httpx.AsyncClient(verify=trusting(ca), trust_env=False) as anonymous:
            refused = await anonymous.post(f"{webhook}/mutate", json=review)
            assert refused.status_code == 403
            assert "RGPU_WEBHOOK_CLIENT_CA_FILE" in refused.json()["message"]
            # The kubelet's probes carry no certificate and still get health.
            assert (await anonymous.get(f"{webhook}/healthz")).status_code == 200
        async with httpx.AsyncClient(verify=trusting(ca, stranger), trust_env=False) as forged:
            with pytest.raises(httpx.TransportError):
                await forged.post(f"{webhook}/mutate", json=review)
        async with httpx.AsyncClient(
            verify=trusting(ca, apiserver), trust_env=False
        ) as apiserver_client:
            reply = await apiserver_client.post(f"{webhook}/mutate", json=review)
            assert reply.status_code == 200 and reply.json()["response"]["allowed"] is True


# -- turns per client address ----------------------------------------------------------------------


async def test_reviews_beyond_an_addresss_turns_wait_and_then_get_429_while_others_pass(
    serve_extender, ca, build
) -> None:
    review = orjson.dumps(build.review(build.pod()))
    small = (
        b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(review)
    )

    def hold(port: int) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock = trusting(ca).wrap_socket(raw, server_hostname="127.0.0.1")
        sock.sendall(small + review[:10])  # its turn taken, its body never finished
        return sock

    async with serve_extender() as (scheduler, webhook):
        held = [
            await anyio.to_thread.run_sync(hold, port_of(webhook)) for _ in range(TURNS_PER_CLIENT)
        ]
        try:
            await anyio.sleep(0.3)
            other = await anyio.to_thread.run_sync(
                lambda: exchange_from(
                    "127.0.0.2",
                    port_of(webhook),
                    small.replace(b"host: x", b"host: x\r\nconnection: close") + review,
                    trusting(ca),
                )
            )
            assert other.startswith(b"HTTP/1.1 200 ")
            with anyio.fail_after(WAIT_SECONDS + 5):
                waited = await mutate(webhook, ca, review)
            assert waited.status_code == 429
            assert "AdmissionReviews being decided already" in waited.json()["message"]
        finally:
            for sock in held:
                sock.close()
        async with httpx.AsyncClient(trust_env=False) as client:
            text = (await client.get(f"{scheduler}/metrics")).text
        assert 'rgpu_http_rejected_total{listener="webhook",reason="queue_timeout"} 1.0' in text


async def test_heavy_reviews_take_turns_one_per_address_and_a_few_in_all() -> None:
    heavy = Turns(per_client=1, total=2, wait_seconds=0.2)
    async with heavy.turn("10.0.0.1", "heavy reviews"), heavy.turn("10.0.0.2", "heavy reviews"):
        with pytest.raises(Busy, match=r"10\.0\.0\.1 has 1 heavy reviews"):
            async with heavy.turn("10.0.0.1", "heavy reviews"):
                pass
        with pytest.raises(Busy, match="deciding 2 heavy reviews already"):
            async with heavy.turn("10.0.0.3", "heavy reviews"):
                pass
    async with heavy.turn("10.0.0.1", "heavy reviews"):
        pass
    assert heavy._clients == {}
