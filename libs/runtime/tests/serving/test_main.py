from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import pytest
from starlette.applications import Starlette

from rgpu_runtime.kube import kube_client
from rgpu_runtime.serving import _main, create_service_app, run_service
from rgpu_runtime.settings import Settings

pytestmark = pytest.mark.process


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def plain_app(settings: Settings) -> Starlette:
    return create_service_app(service=settings.service, routes=[])


def test_a_bad_setting_exits_2_with_the_key_and_value(capsys: pytest.CaptureFixture[str]) -> None:
    status = run_service("metrics", plain_app, settings=Settings, environ={"RGPU_LISTEN": "http"})
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("rgpu-metrics: RGPU_LISTEN='http': expected host:port")
    assert "Traceback" not in err


def test_a_settings_error_while_starting_exits_2(tmp_path: object) -> None:
    def needs_kube(settings: Settings) -> Starlette:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[dict[str, object]]:
            async with kube_client(settings):
                yield {}

        return create_service_app(service="allocator", routes=[], lifespan=lifespan)

    environ = {
        "RGPU_LISTEN": "127.0.0.1:0",
        "RGPU_LOG_FORMAT": "text",
        "KUBECONFIG": f"{tmp_path}/absent",
    }
    assert run_service("allocator", needs_kube, settings=Settings, environ=environ) == 2


SERVICE = """
from rgpu_runtime.serving import create_service_app, run_service
from rgpu_runtime.settings import Settings

def create_app(settings):
    return create_service_app(service=settings.service, routes=[])

raise SystemExit(run_service("metrics", create_app, settings=Settings))
"""


def test_a_service_serves_then_stops_cleanly_on_sigterm() -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RGPU_", "OTEL_"))}
    environ.update({"RGPU_LISTEN": "127.0.0.1:0", "RGPU_LOG_FORMAT": "json"})
    process = subprocess.Popen(
        [sys.executable, "-c", SERVICE], env=environ, stderr=subprocess.PIPE, text=True
    )
    try:
        url = _serving_url(process)
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


def _serving_url(process: subprocess.Popen[str]) -> str:
    assert process.stderr is not None
    for line in process.stderr:
        entry = json.loads(line)
        assert entry["severity"] in ("INFO", "DEBUG"), entry
        if entry["message"].startswith("serving on "):
            return str(entry["message"].removeprefix("serving on "))
    raise AssertionError(f"the service exited with {process.wait()} before serving")


def test_a_stuck_span_flush_does_not_hold_the_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_main, "SPAN_FLUSH_SECONDS", 0.01)
    release = threading.Event()
    try:
        _main._flush_spans(lambda: release.wait(60))
        assert any(t.name == "span-flush" and t.is_alive() for t in threading.enumerate())
    finally:
        release.set()
