"""Extender: what each verb costs kube-scheduler, over real loopback sockets, beside targets.

Run: ``python3 -m uv run --no-sync python bench/bench_extender.py [--rounds 2000]``

kube-scheduler calls ``/filter`` once per pod, serially, so the filter's latency caps the cluster's
scheduling rate (docs/design.md §9). Every figure is a median (p99 beside it) over sequential calls
from an aiohttp-backed httpx client (runtime's ``http_client``) to the extender served by runtime's
``running`` (uvicorn, httptools, uvloop):

* filter, loopback       - scheduler -> extender -> fake allocator (its own uvicorn on loopback),
  a pod asking for one card, 100 candidate names, fleet of 500 servers
* filter, in process     - the same through ``httpx.ASGITransport`` with the allocator at an
  ``httpx.MockTransport``: the extender's own cost without sockets
* filter, no request     - a pod asking for nothing (no allocator call)
* filter, full Nodes     - 300 full Node objects (nodeCacheCapable off), about 1.5 MB per call
* prioritize, loopback   - claim lookup at the allocator, 100 candidates scored
* bind, loopback         - commit at the allocator + Binding written to kubesim (a Python
  apiserver, so this figure is dominated by the simulator)
* mutate, TLS loopback   - AdmissionReview of the shared fixture pod over the TLS listener
"""

from __future__ import annotations

import argparse
import ssl
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import trustme
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_extender import create_app, listeners
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import run_apiserver
from rgpu_runtime.peers import http_client
from rgpu_runtime.serving import Listener, running

TARGETS_MS = {
    "filter, loopback": 3.0,
    "filter, in process": 1.0,
    "filter, no request": 1.5,
    "filter, full Nodes": 20.0,
    "prioritize, loopback": 3.0,
    "bind, loopback": 15.0,
    "mutate, TLS loopback": 3.0,
}
"""Loopback figures allow about 1 ms per hop (the hop target of ``bench_runtime.py``, docs/design.md
§9) plus the extender's own work; the in-process figure is that work plus two in-process httpx hops
(scheduler -> extender, extender -> allocator), which cost about 0.15 ms each."""

SERVERS = 500
CANDIDATES = 100
RACK = "topology.rgpu.io/rack"
ENDPOINT_PATH = "metadata.annotations['hami.io/lupine-endpoint']"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"


def fleet() -> dict[str, Any]:
    servers: list[dict[str, Any]] = [
        {
            "name": f"lupine-{s:04d}",
            "endpoint": f"10.1.{s // 250}.{s % 250}:14833",
            "port": 14833,
            "ready": True,
            "reachable": True,
            "usageReported": True,
            "busy": [],
            "topology": {RACK: f"rack-{s // 8}"},
            "cards": [],
            "error": None,
        }
        for s in range(SERVERS)
    ]
    return {"revision": 1, "observedAt": 0.0, "servers": servers}


def topology() -> dict[str, Any]:
    nodes = [{"name": f"node-{n:04d}", "labels": {RACK: f"rack-{n // 40}"}} for n in range(2000)]
    return {"revision": 1, "nodes": nodes}


def allocation(uid: str, *, committed: bool) -> dict[str, Any]:
    cards = ["lupine-0001/GPU-a", "lupine-0001/GPU-b"]
    devices = "".join(f"{c},RemoteGPU,40960,100:" for c in cards) + ";"
    annotations = {
        "hami.io/remote-gpu-devices-to-allocate": devices,
        "hami.io/remote-gpu-devices-allocated": devices,
        "hami.io/lupine-endpoint": "10.1.0.1:14833",
    }
    return {
        "pod": {"uid": uid, "namespace": "ml-team", "name": "trainer-0"},
        "server": "lupine-0001",
        "endpoint": "10.1.0.1:14833",
        "cards": cards,
        "containers": [{"name": "main", "cards": cards}],
        "state": "committed" if committed else "booked",
        "bookedAt": 0.0,
        "expiresAt": 30.0,
        "annotations": annotations if committed else {},
    }


def peers_app() -> Starlette:
    """Allocator and discovery answering contract JSON at once (long-polls wait)."""
    fleet_body, topology_body = orjson.dumps(fleet()), orjson.dumps(topology())

    def json(body: object, status: int = 200) -> Response:
        return Response(orjson.dumps(body), status, media_type="application/json")

    async def allocate(request: Request) -> Response:
        raw = orjson.loads(await request.body())
        return json(allocation(raw["pod"]["uid"], committed=False))

    async def commit(request: Request) -> Response:
        return json(allocation(request.path_params["uid"], committed=True))

    async def find(request: Request) -> Response:
        return json(allocation(request.path_params["uid"], committed=False))

    def poll(body: bytes) -> Callable[[Request], Awaitable[Response]]:
        async def answer(request: Request) -> Response:
            # Held briefly, not for the whole wait, so shutdown does not wait out long-polls.
            if request.query_params.get("since") == "1":
                await anyio.sleep(min(0.2, float(request.query_params.get("wait", "0"))))
            return Response(body, media_type="application/json")

        return answer

    return Starlette(
        routes=[
            Route("/v1/allocations", allocate, methods=["POST"]),
            Route("/v1/allocations/{uid}/commit", commit, methods=["POST"]),
            Route("/v1/allocations/{uid}", find, methods=["GET"]),
            Route("/v1/fleet", poll(fleet_body), methods=["GET"]),
            Route("/v1/topology", poll(topology_body), methods=["GET"]),
        ]
    )


def wired_pod(uid: str = "uid-0", name: str = "trainer-0", count: str = "1") -> dict[str, Any]:
    env = [{"name": "LUPINE_SERVER", "valueFrom": {"fieldRef": {"fieldPath": ENDPOINT_PATH}}}]
    limits = {"nvidia.com/remote-gpu": count} if count else {}
    container = {"name": "main", "image": "trainer:1", "env": env, "resources": {"limits": limits}}
    return {
        "metadata": {"name": name, "namespace": "ml-team", "uid": uid},
        "spec": {"containers": [container], "schedulerName": "rgpu-scheduler"},
    }


def filter_args(pod: dict[str, Any]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": [f"node-{n:04d}" for n in range(CANDIDATES)]}


def full_nodes_args() -> dict[str, Any]:
    filler = "x" * 4000
    items = [
        {"metadata": {"name": f"node-{n:04d}", "labels": {RACK: "r"}, "annotations": {"a": filler}}}
        for n in range(300)
    ]
    return {"Pod": wired_pod(), "Nodes": {"items": items}, "NodeNames": None}


Call = Callable[[int], Awaitable[httpx.Response]]


async def measure(call: Call, rounds: int) -> tuple[float, float]:
    for i in range(min(50, rounds)):
        (await call(i)).raise_for_status()
    samples = []
    for i in range(rounds):
        started = time.perf_counter()
        response = await call(i)
        samples.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def settings(sim_url: str, peers: str, certs: tuple[Path, Path]) -> ExtenderSettings:
    return ExtenderSettings.from_env(
        {
            "RGPU_KUBE_URL": sim_url,
            "RGPU_ALLOCATOR_URL": peers,
            "RGPU_DISCOVERY_URL": peers,
            "RGPU_LISTEN": "127.0.0.1:0",
            "RGPU_WEBHOOK_LISTEN": "127.0.0.1:0",
            "RGPU_TLS_CERT_FILE": str(certs[0]),
            "RGPU_TLS_KEY_FILE": str(certs[1]),
            # The peers here are stand-ins that check no token; the extender sends none.
            "RGPU_AUTH": "none",
        },
    )


def write_certs(directory: Path) -> tuple[trustme.CA, tuple[Path, Path]]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(key)
    return ca, (cert, key)


@asynccontextmanager
async def stack(directory: Path) -> AsyncIterator[tuple[str, str, Any, trustme.CA]]:
    ca, certs = write_certs(directory)
    async with (
        run_apiserver() as sim,
        running(peers_app(), Listener(listen="127.0.0.1:0")) as (peers,),
    ):
        sim.store.create("namespaces", {"metadata": {"name": "ml-team"}})
        app = create_app(settings(sim.url, peers, certs), registry=CollectorRegistry())
        async with running(app, *listeners(settings(sim.url, peers, certs))) as (plain, tls):
            yield plain, tls, sim, ca


async def loopback_figures(rounds: int, directory: Path) -> dict[str, tuple[float, float]]:
    figures: dict[str, tuple[float, float]] = {}
    async with stack(directory) as (plain, tls, sim, ca):
        async with http_client(base_url=plain, timeout=10) as client:
            figures["filter, loopback"] = await measure(
                lambda i: client.post("/filter", json=filter_args(wired_pod(f"uid-{i}"))), rounds
            )
            no_request = filter_args(wired_pod(count=""))
            figures["filter, no request"] = await measure(
                lambda i: client.post("/filter", json=no_request), rounds
            )
            full = orjson.dumps(full_nodes_args())
            figures["filter, full Nodes"] = await measure(
                lambda i: client.post("/filter", content=full), max(20, rounds // 50)
            )
            prioritize = filter_args(wired_pod())
            figures["prioritize, loopback"] = await measure(
                lambda i: client.post("/prioritize", json=prioritize), rounds
            )
            figures["bind, loopback"] = await bind_figure(client, sim, max(50, rounds // 10))
        figures["mutate, TLS loopback"] = await mutate_figure(tls, ca, rounds)
    return figures


async def bind_figure(client: httpx.AsyncClient, sim: Any, rounds: int) -> tuple[float, float]:
    total = rounds + min(50, rounds)
    uids = []
    for i in range(total):
        pod = wired_pod(name=f"p-{i}")
        del pod["metadata"]["uid"]
        created = sim.store.create("pods", pod)
        uids.append(created["metadata"]["uid"])

    def bind(i: int) -> Awaitable[httpx.Response]:
        args = {"PodName": f"p-{i}", "PodNamespace": "ml-team", "PodUID": uids[i], "Node": "n"}
        return client.post("/bind", json=args)

    warm = min(50, rounds)
    for i in range(warm):
        await bind(i)
    samples = []
    for i in range(warm, total):
        started = time.perf_counter()
        response = await bind(i)
        samples.append((time.perf_counter() - started) * 1000)
        if response.json()["Error"]:
            raise RuntimeError(response.json()["Error"])
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


async def mutate_figure(tls: str, ca: trustme.CA, rounds: int) -> tuple[float, float]:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    review = orjson.loads((FIXTURES / "admission-review-pod-create.json").read_bytes())
    async with httpx.AsyncClient(base_url=tls, verify=context, trust_env=False) as client:
        return await measure(lambda i: client.post("/mutate", json=review), rounds)


async def in_process_figure(rounds: int) -> tuple[float, float]:
    app_peers = peers_app()
    transport = httpx.ASGITransport(app=app_peers)
    env = {"RGPU_KUBE_URL": "http://127.0.0.1:9", "RGPU_AUTH": "none"}
    settings_ = ExtenderSettings.from_env(env)
    app = create_app(
        settings_,
        allocator_transport=transport,
        discovery_transport=transport,
        registry=CollectorRegistry(),
    )
    async with LifespanManager(app) as manager:
        transport_in = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport_in, base_url="http://extender") as client:
            return await measure(
                lambda i: client.post("/filter", json=filter_args(wired_pod(f"uid-{i}"))), rounds
            )


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        figures = await loopback_figures(rounds, Path(directory))
    figures["filter, in process"] = await in_process_figure(rounds)
    print(f"{'figure':<24}{'median ms':>11}{'p99 ms':>9}{'target ms':>11}  ok")
    for name, target in TARGETS_MS.items():
        median, p99 = figures[name]
        mark = "yes" if median <= target else "NO"
        print(f"{name:<24}{median:>11.2f}{p99:>9.2f}{target:>11.1f}  {mark}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    options = parser.parse_args()
    anyio.run(main, options.rounds, backend_options={"use_uvloop": True})
