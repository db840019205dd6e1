"""Shared fixtures for the simulated apiserver's tests: a running server, a client, fixtures."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

import rgpu_testkit
from rgpu_kubesim import ApiOptions, SimApiServer, run_apiserver

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "k8s"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fixture() -> Callable[[str], Any]:
    """Load a shared wire fixture (JSON or YAML) by file name."""

    def load(name: str) -> Any:
        text = (FIXTURES / name).read_text()
        return yaml.safe_load(text) if name.endswith(".yaml") else json.loads(text)

    return load


@pytest.fixture
def jsonl() -> Callable[[str], list[Any]]:
    """Load a shared newline-delimited fixture (watch streams) as a list of events."""

    def load(name: str) -> list[Any]:
        lines = (FIXTURES / name).read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    return load


@pytest.fixture
def options() -> ApiOptions:
    return ApiOptions(bookmark_interval_seconds=0.05)


@pytest.fixture
async def sim(options: ApiOptions) -> AsyncIterator[SimApiServer]:
    async with run_apiserver(options=options) as server:
        yield server


@pytest.fixture
async def client(sim: SimApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as http:
        yield http


Manifest = Callable[..., dict[str, Any]]


def _pod(name: str, *, namespace: str = "default", **extra: Any) -> dict[str, Any]:
    body = rgpu_testkit.pod_manifest(name=name, namespace=namespace)
    body["metadata"].update(extra.pop("metadata", {}))
    body.update(extra)
    return body


def _node(name: str, **labels: str) -> dict[str, Any]:
    return rgpu_testkit.node_manifest(name=name, labels=labels)


def _lease(name: str, *, namespace: str = "default", holder: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"holderIdentity": holder},
    }


@pytest.fixture
def pod() -> Manifest:
    """Factory of minimal valid pods: pod(name, namespace=..., metadata={...}, spec={...})."""
    return _pod


@pytest.fixture
def node() -> Manifest:
    return _node


@pytest.fixture
def lease() -> Manifest:
    return _lease


class WatchReader:
    """Reads newline-delimited watch events from a streaming httpx response."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def next(self, timeout: float = 5.0) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            async for line in self._lines:
                if line:
                    event: dict[str, Any] = json.loads(line)
                    return event
        raise AssertionError("the watch stream ended")

    async def take(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        return [await self.next(timeout) for _ in range(count)]

    async def ended(self, timeout: float = 5.0) -> bool:
        with anyio.fail_after(timeout):
            async for line in self._lines:
                if line:
                    return False
        return True


@pytest.fixture
def open_watch(
    client: httpx.AsyncClient,
) -> Callable[[str], contextlib.AbstractAsyncContextManager[WatchReader]]:
    """open_watch(path_with_query) -> async context manager yielding a WatchReader."""

    @contextlib.asynccontextmanager
    async def opened(path: str) -> AsyncIterator[WatchReader]:
        async with client.stream("GET", path) as response:
            assert response.status_code == 200
            yield WatchReader(response)

    return opened


@pytest.fixture
def eventually() -> Callable[..., Awaitable[None]]:
    """await eventually(lambda: ...): poll a condition the test cannot await directly."""
    return rgpu_testkit.eventually


Kubectl = Callable[..., Awaitable[str]]


@pytest.fixture
def kubectl(sim: SimApiServer, tmp_path: Path) -> Kubectl:
    """Run kubectl with a throwaway kubeconfig, cache and HOME; returns stdout, fails on error."""
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("kubectl is not on PATH; `make tools` installs it (apt-get install kubectl)")
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\n")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(config)}
    base = [
        binary,
        f"--server={sim.url}",
        f"--kubeconfig={config}",
        f"--cache-dir={tmp_path}/cache",
    ]

    async def run(*args: str, stdin: str | None = None) -> str:
        result = await anyio.run_process(
            [*base, *args], input=stdin.encode() if stdin else None, env=env, check=False
        )
        output, errors = result.stdout.decode(), result.stderr.decode()
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {errors}"
        return output

    return run
