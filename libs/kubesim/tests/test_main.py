"""``python -m rgpu_kubesim``: serve end to end with kubectl, signals, and argument errors."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rgpu_contracts.hami import LABEL_SERVER
from rgpu_kubesim.__main__ import main

pytestmark = pytest.mark.process

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


class Served:
    """A running ``serve`` subprocess and the URL it printed."""

    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url

    def stop(self, signum: int) -> int:
        self.proc.send_signal(signum)
        return self.proc.wait(timeout=15)


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"serve printed nothing within {timeout} s")
    return proc.stdout.readline()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> Served:
        command = [sys.executable, "-m", "rgpu_kubesim", "serve", *args]
        stderr = (tmp_path / f"serve-{len(started)}.log").open("w")
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
        stderr.close()
        started.append(proc)
        line = _first_line(proc, timeout=30)
        prefix = "kubesim listening on "
        assert line.startswith(prefix), line
        return Served(proc, line.removeprefix(prefix).strip())

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def kubectl(url: str, tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "no-kubeconfig"), "HOME": str(tmp_path)}
    command = ["kubectl", "--server", url, "--cache-dir", str(tmp_path / "kube-cache"), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def endpoint(node: dict[str, Any]) -> str:
    ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    port = node["metadata"]["labels"][LABEL_SERVER] or "14833"
    return f"{ip}:{port}"


@needs_kubectl
def test_serve_seeds_a_fleet_kubectl_lists_with_lupine_on_every_endpoint(
    serve: Any, tmp_path: Path
) -> None:
    served = serve("--servers", "4", "--cards", "8", "--clients", "16", "--seed", "31")
    assert served.proc.poll() is None
    table = kubectl(served.url, tmp_path, "get", "nodes")
    assert len(table.strip().splitlines()) == 1 + 20
    assert table.count(" Ready ") == 20
    nodes = json.loads(kubectl(served.url, tmp_path, "get", "nodes", "-o", "json"))["items"]
    servers = [n for n in nodes if LABEL_SERVER in n["metadata"]["labels"]]
    assert len(servers) == 4
    for node in servers:
        assert httpx.get(f"http://{endpoint(node)}/", timeout=5).text == "lupine\n"
    assert served.stop(signal.SIGTERM) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{endpoint(servers[0])}/", timeout=5)


@needs_kubectl
def test_serve_without_a_fleet_serves_an_empty_cluster_until_sigint(
    serve: Any, tmp_path: Path
) -> None:
    served = serve()
    assert json.loads(kubectl(served.url, tmp_path, "get", "nodes", "-o", "json"))["items"] == []
    started = time.monotonic()
    assert served.stop(signal.SIGINT) == 0
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--port", "70000"], "--port"),
        (["--cards", "0"], "--cards"),
        (["--servers", "many"], "--servers"),
        (["--h2only-share", "1.5"], "--h2only-share"),
        (["--unhealthy-share", "x"], "--unhealthy-share"),
    ],
)
def test_bad_serve_flags_exit_2_naming_the_flag(
    args: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["serve", *args])
    assert caught.value.code == 2
    assert flag in capsys.readouterr().err


def test_certs_subcommand_writes_the_serving_and_the_client_pair_and_their_ca(
    tmp_path: Path,
) -> None:
    assert main(["certs", "--out", str(tmp_path), "--host", "127.0.0.1", "--dns", "x.svc"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ca.pem", "client.crt", "client.key", "tls.crt", "tls.key"]
    assert oct((tmp_path / "client.key").stat().st_mode & 0o777) == "0o600"


def test_certs_subcommand_reports_a_bad_host_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "--out", str(tmp_path), "--host", "not-an-ip"]) == 2
    err = capsys.readouterr().err
    assert "host: 'not-an-ip' is not an IP address" in err
    assert "Traceback" not in err


def test_certs_runs_as_a_module(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "rgpu_kubesim", "certs", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tls.key").exists()
