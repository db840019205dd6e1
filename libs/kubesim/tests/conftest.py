"""Shared fixtures for the simulated apiserver's tests: a running server, a client, fixtures."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rgpu_kubesim import ApiOptions, SimApiServer, run_apiserver

FIXTURES = Path("/work/shared/fixtures/k8s")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fixture() -> Callable[[str], Any]:
    """Load a shared wire fixture by file name."""

    def load(name: str) -> Any:
        return json.loads((FIXTURES / name).read_text())

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
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **extra.pop("metadata", {})},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }
    body.update(extra)
    return body


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


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
