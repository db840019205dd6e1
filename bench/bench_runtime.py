"""rgpu_runtime: the per-hop and per-event costs every service pays, beside their targets.

Run: ``python3 -m uv run --no-sync python bench/bench_runtime.py [--rounds 2000] [--pods 2000]``

Figures (medians unless said otherwise):

* hop: request_json, aiohttp - ``request_json`` through ``http_client``'s default transport
  (httpx_aiohttp wrapped in OpenTelemetry's transport) to a ``create_service_app`` echo route
  served by ``running`` (uvicorn, httptools, uvloop): one sequential small JSON POST
* hop: aiohttp, no OTel wrapper - the same without the tracing transport, to show its cost
* hop: httpx default transport - the same with ``httpx.AsyncHTTPTransport``, the design
  ``http_client`` does not use, measured so the choice stays honest
* watch decode, raw / model - one pod watch line decoded by ``decode_event`` (orjson, dict)
  versus kubernetes_asyncio's ``Watch.unmarshal_event`` (json + V1Pod model), per event and
  projected for 100,000 pods (the relist/rewatch after an allocator restart)
* list N pods, call_raw / call - ``list_pod_for_all_namespaces`` from the simulated apiserver
  (when rgpu_kubesim is installed), as dicts versus as models
* Versioned wake - ``publish`` until the last of 1,000 long-poll waiters has resumed
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
from httpx_aiohttp import AiohttpTransport
from kubernetes_asyncio.watch import Watch
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_runtime.feeds import Versioned
from rgpu_runtime.kube import decode_event, kube_client
from rgpu_runtime.peers import http_client, request_json
from rgpu_runtime.serving import Listener, create_service_app, json_response, read_json, running
from rgpu_runtime.settings import Settings

HOP_TARGET_MS = 1.0
"""One hop between two services (docs/design.md §9): httpx over httpx-aiohttp to a starlette app,
plus what ours add (the latency histogram, body limit and tracing transport), under 1 ms."""
DECODE_100K_TARGET_S = 3.0
"""A restarted allocator relists and rewatches every pod; 100k pods must decode in seconds,
not the better part of a minute."""
WAKE_TARGET_MS = 10.0
"""A fleet change must reach 1,000 waiting long-polls well inside one scheduling cycle."""

WATCH_LINE = (
    (Path(__file__).resolve().parents[1] / "fixtures" / "k8s" / "watch-pods.jsonl")
    .read_text()
    .splitlines()[0]
).encode()


def report(name: str, samples: list[float], unit: str, target: str = "") -> float:
    median = statistics.median(samples)
    p99 = sorted(samples)[max(0, int(len(samples) * 0.99) - 1)]
    print(f"{name:<34} median {median:9.3f} {unit}   p99 {p99:9.3f} {unit}   {target}")
    return median


def echo_app() -> Any:
    async def echo(request: Request) -> Response:
        return json_response(await read_json(request))

    return create_service_app(service="bench", routes=[Route("/echo", echo, methods=["POST"])])


def decode_body(raw: Any) -> Any:
    return raw


async def time_hops(client: httpx.AsyncClient, rounds: int) -> list[float]:
    body = {"pod": "ml-team/trainer-0", "uid": "8f6a3c1e", "nodes": ["node-a", "node-b"]}
    for _ in range(50):
        await request_json(client, "POST", "/echo", decode=decode_body, body=body)
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await request_json(client, "POST", "/echo", decode=decode_body, body=body)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def bench_hops(rounds: int) -> None:
    async with running(echo_app(), Listener(listen="127.0.0.1:0")) as (url,):
        clients: list[tuple[str, Callable[[], httpx.AsyncClient]]] = [
            ("hop: request_json, aiohttp", lambda: http_client(base_url=url, timeout=5)),
            (
                "hop: aiohttp, no OTel wrapper",
                lambda: httpx.AsyncClient(base_url=url, transport=AiohttpTransport()),
            ),
            (
                "hop: httpx default transport",
                lambda: http_client(base_url=url, timeout=5, transport=httpx.AsyncHTTPTransport()),
            ),
        ]
        for name, make in clients:
            async with make() as client:
                samples = await time_hops(client, rounds)
            report(name, samples, "ms", f"target < {HOP_TARGET_MS} ms")


def time_calls(fn: Callable[[], object], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


async def bench_decode(rounds: int) -> None:
    watch = Watch()
    # Watch() opens an ApiClient (and an aiohttp session) of its own; close it when done.
    async with watch._api_client:
        _decode_figures(watch, rounds)


def _decode_figures(watch: Watch, rounds: int) -> None:
    raw = report(
        "watch decode, raw dict", time_calls(lambda: decode_event(WATCH_LINE, "w"), rounds), "us"
    )
    model = report(
        "watch decode, V1Pod model",
        time_calls(lambda: watch.unmarshal_event(WATCH_LINE, "V1Pod"), rounds),
        "us",
    )
    for name, per_event in (("raw", raw), ("model", model)):
        projected = per_event * 100_000 / 1e6
        print(
            f"{'  100k pods, ' + name:<34} {projected:9.2f} s"
            f"{'':>25}target < {DECODE_100K_TARGET_S} s"
        )


async def bench_list(pods: int, rounds: int) -> None:
    try:
        import rgpu_kubesim
    except ImportError:
        print("list pods: rgpu_kubesim not installed; skipped")
        return
    async with rgpu_kubesim.run_apiserver() as sim:
        for i in range(pods):
            sim.store.create("pods", _pod(f"p-{i:05d}"), namespace="default")
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="allocator")
        async with kube_client(settings, timeout=60) as kube:
            fn = kube.core.list_pod_for_all_namespaces
            raw = await _timed(lambda: kube.call_raw(fn), rounds)
            model = await _timed(lambda: kube.call(fn), rounds)
    report(f"list {pods} pods, call_raw (dicts)", raw, "ms")
    report(f"list {pods} pods, call (models)", model, "ms")


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "trainer"}},
        "spec": {
            "schedulerName": "rgpu-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/ml/trainer:1.4",
                    "resources": {"limits": {"nvidia.com/remote-gpu": "1"}},
                    "env": [{"name": "LUPINE_SERVER", "value": "x"}],
                }
            ],
        },
    }


async def _timed(call: Callable[[], Awaitable[object]], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def bench_wake(rounds: int, waiters: int = 1000) -> None:
    samples = [await _one_wake(waiters) for _ in range(rounds)]
    report(f"Versioned wake, {waiters} waiters", samples, "ms", f"target < {WAKE_TARGET_MS} ms")


async def _one_wake(waiters: int) -> float:
    value = Versioned(0)
    woken = 0
    done = anyio.Event()

    async def wait() -> None:
        nonlocal woken
        await value.wait_newer(1, timeout=60)
        woken += 1
        if woken == waiters:
            done.set()

    async with anyio.create_task_group() as tg:
        for _ in range(waiters):
            tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        started = time.perf_counter()
        value.publish(1)
        await done.wait()
    return (time.perf_counter() - started) * 1000


async def run(args: argparse.Namespace) -> None:
    await bench_hops(args.rounds)
    await bench_decode(args.rounds)
    await bench_list(args.pods, 5)
    await bench_wake(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=2000)
    args = parser.parse_args()
    anyio.run(run, args, backend_options={"use_uvloop": True})


if __name__ == "__main__":
    main()
