from __future__ import annotations

import os
import signal
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import httpx
import pytest
import trustme
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rgpu_runtime.errors import SettingsError
from rgpu_runtime.serving import Listener, create_service_app, json_response, running, state_value
from rgpu_runtime.serving._listeners import serve, serve_listeners

pytestmark = pytest.mark.anyio


class Counter:
    def __init__(self) -> None:
        self.started = 0
        self.stopped = 0
        self.up = anyio.Event()


def counting_app(counter: Counter, *, fail_with: Exception | None = None) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Counter]]:
        if fail_with is not None:
            raise fail_with
        counter.started += 1
        counter.up.set()
        yield {"counter": counter}
        counter.stopped += 1

    async def starts(request: Request) -> Response:
        return json_response({"started": state_value(request, "counter", Counter).started})

    async def slow(request: Request) -> Response:
        await anyio.sleep(0.3)
        return json_response({"done": True})

    routes = [Route("/starts", starts), Route("/slow", slow)]
    return create_service_app(service="test", routes=routes, lifespan=lifespan)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "tls.crt", directory / "tls.key"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    return ca, cert, key


async def test_one_app_on_plain_and_tls_listeners_runs_its_lifespan_once(
    certificate: tuple[trustme.CA, Path, Path],
) -> None:
    ca, cert, key = certificate
    counter = Counter()
    plain = Listener(listen="127.0.0.1:0")
    tls = Listener(listen="127.0.0.1:0", ssl_certfile=str(cert), ssl_keyfile=str(key))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with running(counting_app(counter), plain, tls) as (http_url, https_url):
        assert http_url.startswith("http://127.0.0.1:")
        assert https_url.startswith("https://127.0.0.1:")
        async with httpx.AsyncClient(verify=context) as client:
            for url in (http_url, https_url):
                response = await client.get(f"{url}/starts")
                assert response.json() == {"started": 1}
    assert (counter.started, counter.stopped) == (1, 1)


async def test_ipv6_listener_reports_a_bracketed_url() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        async with running(counting_app(Counter()), Listener(listen="[::1]:0")) as (url,):
            assert url.startswith("http://[::1]:")
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"{url}/healthz")).status_code == 200
    except SettingsError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")


async def test_an_address_in_use_is_a_settings_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SettingsError, match=f"cannot listen on 127.0.0.1:{port}"):
            async with running(counting_app(Counter()), Listener(listen=f"127.0.0.1:{port}")):
                pass


async def test_an_unreadable_certificate_is_a_settings_error(tmp_path: Path) -> None:
    listener = Listener(
        listen="127.0.0.1:0",
        ssl_certfile=str(tmp_path / "missing.crt"),
        ssl_keyfile=str(tmp_path / "missing.key"),
    )
    with pytest.raises(SettingsError, match="check RGPU_TLS_CERT_FILE and RGPU_TLS_KEY_FILE"):
        async with running(counting_app(Counter()), listener):
            pass


async def test_a_lifespan_failure_surfaces_as_the_original_exception() -> None:
    app = counting_app(Counter(), fail_with=SettingsError("no Kubernetes API configured"))
    with pytest.raises(SettingsError, match="no Kubernetes API configured"):
        async with running(app, Listener(listen="127.0.0.1:0")):
            pass


async def test_requests_in_flight_finish_before_the_app_shuts_down() -> None:
    counter = Counter()
    results: list[tuple[int, int]] = []
    listener = Listener(listen="127.0.0.1:0")
    async with (
        httpx.AsyncClient() as client,
        anyio.create_task_group() as tg,
        running(counting_app(counter), listener) as (url,),
    ):

        async def slow_request() -> None:
            response = await client.get(f"{url}/slow")
            results.append((response.status_code, counter.stopped))

        tg.start_soon(slow_request)
        await anyio.sleep(0.1)
    assert results == [(200, 0)]
    assert counter.stopped == 1


async def test_serve_listeners_stops_gracefully_on_sigterm() -> None:
    counter = Counter()
    urls: list[str] = []

    def ready(found: tuple[str, ...]) -> None:
        urls.extend(found)
        os.kill(os.getpid(), signal.SIGTERM)

    with anyio.fail_after(10):
        await serve_listeners(counting_app(counter), [Listener(listen="127.0.0.1:0")], ready=ready)
    assert urls[0].startswith("http://127.0.0.1:")
    assert (counter.started, counter.stopped) == (1, 1)


async def test_serve_is_serve_listeners_with_one_listener() -> None:
    counter = Counter()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(serve, counting_app(counter), listen="127.0.0.1:0"))
            await counter.up.wait()
            os.kill(os.getpid(), signal.SIGINT)
    assert counter.stopped == 1


def hidden(app: ASGIApp) -> ASGIApp:
    """A face that shows nothing but ``/starts``."""

    async def face(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/starts":
            await json_response({"hidden": scope["path"]}, 404)(scope, receive, send)
            return
        await app(scope, receive, send)

    return face


async def test_a_listener_face_shows_its_part_of_the_app_with_the_shared_state() -> None:
    counter = Counter()
    plain, faced = Listener(listen="127.0.0.1:0"), Listener(listen="127.0.0.1:0", face=hidden)
    async with (
        running(counting_app(counter), plain, faced) as (whole, part),
        httpx.AsyncClient(trust_env=False) as client,
    ):
        assert (await client.get(f"{part}/starts")).json() == {"started": 1}
        assert (await client.get(f"{part}/healthz")).status_code == 404
        assert (await client.get(f"{whole}/healthz")).status_code == 200
    assert counter.started == 1


async def test_a_client_ca_makes_the_tls_listener_require_a_client_certificate(
    certificate: tuple[trustme.CA, Path, Path], tmp_path: Path
) -> None:
    ca, cert, key = certificate
    client_ca = trustme.CA()
    client_ca.cert_pem.write_to_path(str(tmp_path / "clients.pem"))
    listener = Listener(
        listen="127.0.0.1:0",
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        client_ca_file=str(tmp_path / "clients.pem"),
    )
    anonymous, signed = ssl.create_default_context(), ssl.create_default_context()
    ca.configure_trust(anonymous)
    ca.configure_trust(signed)
    client_ca.issue_cert("kube-scheduler").configure_cert(signed)
    async with running(counting_app(Counter()), listener) as (url,):
        async with httpx.AsyncClient(verify=anonymous, trust_env=False) as client:
            with pytest.raises(httpx.TransportError):
                await client.get(f"{url}/healthz")
        async with httpx.AsyncClient(verify=signed, trust_env=False) as client:
            assert (await client.get(f"{url}/healthz")).status_code == 200
