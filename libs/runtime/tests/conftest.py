"""Shared fixtures for rgpu_runtime's tests: fixture files, and a small apiserver stand-in
served over real HTTP from the shared Kubernetes wire fixtures. The clean environment is the
root conftest's (it also drops RGPU_* variables the caller's shell may carry)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rgpu_runtime.kube import KubeClient, kube_client
from rgpu_runtime.serving import Listener, running
from rgpu_runtime.settings import Settings

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
K8S = FIXTURES / "k8s"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # Session scope lets module-scoped async fixtures (the apiserver) share one event loop.
    return "asyncio"


def load_k8s(name: str) -> Any:
    return json.loads((K8S / name).read_text())


@pytest.fixture(name="k8s_fixture")
def k8s_fixture_loader() -> Callable[[str], Any]:
    """Load a shared Kubernetes wire fixture by file name."""
    return load_k8s


def k8s_lines(name: str) -> list[bytes]:
    return [line.encode() + b"\n" for line in (K8S / name).read_text().splitlines() if line]


@dataclass
class Apiserver:
    """What the stand-in apiserver saw and how it should behave."""

    url: str = ""
    bound: dict[str, str] = field(default_factory=dict)
    bindings: list[dict[str, Any]] = field(default_factory=list)
    watch_queries: list[dict[str, str]] = field(default_factory=list)
    list_queries: list[dict[str, str]] = field(default_factory=list)


def _status(name: str, code: int, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(load_k8s(name)), code, headers, media_type="application/json")


def apiserver_app(seen: Apiserver) -> Starlette:
    pod = load_k8s("pod-list-rv0.json")["items"][0]

    async def read_pod(request: Request) -> Response:
        if request.path_params["name"] != pod["metadata"]["name"]:
            return _status("status-404-pod-notfound.json", 404)
        return Response(json.dumps(pod), media_type="application/json")

    async def bind(request: Request) -> Response:
        name = request.path_params["name"]
        body = await request.json()
        seen.bindings.append(body)
        if name in seen.bound:
            return _status("status-409-binding-already-assigned.json", 409)
        seen.bound[name] = body["target"]["name"]
        return _status("binding-response-201.json", 201)

    async def replace_pod(request: Request) -> Response:
        return _status("status-409-conflict-resourceversion.json", 409)

    async def all_pods(request: Request) -> Response:
        query = dict(request.query_params)
        if query.get("watch", "").lower() == "true":
            seen.watch_queries.append(query)
            return _watch_stream(query)
        seen.list_queries.append(query)
        return _page(query)

    def _watch_stream(query: dict[str, str]) -> Response:
        name = (
            "watch-error-410.jsonl"
            if query.get("resourceVersion") == "4530"
            else "watch-pods.jsonl"
        )
        lines = k8s_lines(name)[:1] if name.startswith("watch-error") else k8s_lines(name)

        async def stream() -> AsyncIterator[bytes]:
            for line in lines:
                yield line

        return StreamingResponse(stream(), media_type="application/json")

    def _page(query: dict[str, str]) -> Response:
        listing = load_k8s("pod-list-rv0.json")
        second = json.loads(json.dumps(listing["items"][0]))
        second["metadata"]["name"] = "trainer-1"
        if query.get("continue") == "page-2":
            listing["items"] = [second]
        else:
            listing["metadata"]["continue"] = "page-2"
        return Response(json.dumps(listing), media_type="application/json")

    async def namespaced_pods(request: Request) -> Response:
        return Response(
            json.dumps(
                {
                    "kind": "Status",
                    "code": 503,
                    "reason": "ServiceUnavailable",
                    "message": "etcd is sad",
                }
            ),
            503,
            {"Retry-After": "3"},
            media_type="application/json",
        )

    async def lease(request: Request) -> Response:
        if request.method == "PUT":
            return _status("status-422-lease-update-without-resourceversion.json", 422)
        if request.path_params["name"] == "slow":
            await anyio.sleep(0.3)
        forbidden = {
            "kind": "Status",
            "code": 403,
            "reason": "Forbidden",
            "message": "leases is forbidden",
        }
        return Response(json.dumps(forbidden), 403, media_type="application/json")

    async def garbage(request: Request) -> Response:
        return Response(b"<html>proxy error</html>", 502, media_type="text/html")

    return Starlette(
        routes=[
            Route("/api/v1/namespaces/{ns}/pods/{name}", read_pod, methods=["GET"]),
            Route("/api/v1/namespaces/{ns}/pods/{name}", replace_pod, methods=["PUT"]),
            Route("/api/v1/namespaces/{ns}/pods/{name}/binding", bind, methods=["POST"]),
            Route("/api/v1/pods", all_pods, methods=["GET"]),
            Route("/api/v1/namespaces/{ns}/pods", namespaced_pods, methods=["GET"]),
            Route("/api/v1/nodes", garbage, methods=["GET"]),
            Route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
                lease,
                methods=["GET", "PUT"],
            ),
        ]
    )


@pytest.fixture(scope="module")
async def apiserver_process() -> AsyncIterator[Apiserver]:
    seen = Apiserver()
    async with running(apiserver_app(seen), Listener(listen="127.0.0.1:0")) as urls:
        seen.url = urls[0]
        yield seen


@pytest.fixture
def apiserver(apiserver_process: Apiserver) -> Apiserver:
    """The module's apiserver stand-in, with what it saw reset for this test."""
    apiserver_process.bound.clear()
    apiserver_process.bindings.clear()
    apiserver_process.watch_queries.clear()
    apiserver_process.list_queries.clear()
    return apiserver_process


@pytest.fixture
async def kube(apiserver: Apiserver) -> AsyncIterator[KubeClient]:
    settings = Settings.from_env({"RGPU_KUBE_URL": apiserver.url}, service="allocator")
    async with kube_client(settings, timeout=2.0) as client:
        yield client
