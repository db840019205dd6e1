"""Input bounds: what an oversized or deep request costs a service, in memory and time.

Run: ``python3 -m uv run --no-sync python bench/bench_bounds.py [--mib 16] [--limit-kib 3136]``

Figures (peak Python allocations by tracemalloc, in this one process, which holds both the
client and a ``create_service_app`` served by ``running`` on loopback):

* 16 MiB chunked body to a route limited to ``--limit-kib`` - refused while streaming; the
  peak should stay within a small multiple of the limit, not of the body
* 16 MiB body with an honest Content-Length - refused before any of it is read
* body at the limit, decoded - ``orjson.loads`` (what ``read_json`` does) of a pod-list-shaped
  document just under the limit: the parsed objects' peak as a multiple of the body (the cost
  a limit must allow for), and the time it takes
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_runtime.serving import (
    Listener,
    body_limit,
    create_service_app,
    json_response,
    read_json,
    running,
)

CHUNK = 64 * 1024
MIB = 1 << 20


async def mutate(request: Request) -> Response:
    review = await read_json(request)
    return json_response({"size": len(review)})  # type: ignore[arg-type]


async def peak(action: Callable[[], Awaitable[int]]) -> tuple[int, int]:
    """Run ``action`` under tracemalloc; returns (its result, peak bytes above the start)."""
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    try:
        result = await action()
        _, top = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, top - base


def document(target: int) -> bytes:
    """A pod-list-shaped JSON document of about ``target`` bytes."""
    item = {
        "metadata": {"name": "pod-00000", "namespace": "ml-team", "labels": {"app": "train"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]},
    }
    count = max(1, target // len(orjson.dumps(item)))
    return orjson.dumps({"items": [item] * count})


async def chunked_post(url: str, total: int) -> int:
    """POST ``total`` bytes in chunks, generated as they are sent; returns the status."""

    async def body() -> AsyncIterator[bytes]:
        for _ in range(total // CHUNK):
            yield b" " * CHUNK

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        try:
            return (await client.post("/mutate", content=body())).status_code
        except httpx.TransportError:
            return 0  # the server may close before the client finished sending


async def declared_post(url: str, total: int) -> int:
    """Send only the headers of a ``total``-byte POST; returns the status the server answers."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    async with await anyio.connect_tcp(host, int(port)) as stream:
        head = f"POST /mutate HTTP/1.1\r\nHost: svc\r\nContent-Length: {total}\r\n\r\n"
        await stream.send(head.encode())
        reply = await stream.receive()
    return int(reply.split(b" ", 2)[1])


async def main(mib: int, limit: int) -> None:
    routes = [Route("/mutate", mutate, methods=["POST"], middleware=[body_limit(limit)])]
    app = create_service_app(service="extender", routes=routes, max_body_bytes=limit)
    total = mib * MIB
    async with running(app, Listener(listen="127.0.0.1:0")) as (url,):
        # Warm up: the first request pays one-time costs (imports, the TLS context httpx
        # builds, route caches) worth about 16 MiB, which are not the request's.
        await chunked_post(url, 2 * limit)
        status, used = await peak(lambda: chunked_post(url, total))
        print(
            f"{mib} MiB chunked body, limit {limit // 1024} KiB: HTTP {status}, "
            f"peak {used / MIB:.2f} MiB = {used / limit:.1f}x the limit"
        )
        status, used = await peak(lambda: declared_post(url, total))
        print(f"{mib} MiB declared body (headers sent): HTTP {status}, peak {used / 1024:.0f} KiB")
    body = document(limit - 1024)

    async def decode() -> int:
        return len(orjson.loads(body))

    _, used = await peak(decode)
    print(
        f"decode {len(body) / MIB:.2f} MiB document: peak {used / MIB:.2f} MiB = "
        f"{used / len(body):.1f}x the body"
    )
    rounds = 5
    start = time.perf_counter()
    for _ in range(rounds):
        orjson.loads(body)
    plain = (time.perf_counter() - start) / rounds
    print(f"orjson.loads of that document {plain * 1000:.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16, help="oversized body, MiB")
    parser.add_argument("--limit-kib", type=int, default=3136, help="route limit, KiB")
    args = parser.parse_args()
    anyio.run(main, args.mib, args.limit_kib * 1024)
