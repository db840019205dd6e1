"""Webhook: what the most expensive AdmissionReviews cost the extender in CPU, beside targets.

Run: ``python3 -m uv run --no-sync python bench/bench_admission.py [--rounds 7]``

One review of a pod with 1.5 million containers once cost 6.8 s of CPU. Reviews are now refused
by shape before decoding (JSON values, ``reviewshape.MAX_REVIEW_VALUES``) and before any work per
container (``MAX_POD_CONTAINERS``), so the most expensive review the webhook accepts is one
just inside those bounds. Each shape below is sent over the real TLS webhook listener (uvloop,
as ``main`` serves it) by a client in another thread, and the figure is the CPU the server's
thread spent on it (TLS, HTTP, decoding, deciding, answering): the median over ``--rounds``.

Accepted shapes (each at the value bound, within the body limit):

* 256 GPU containers x env  - the container bound, every container asking for a card and
  carrying env entries up to the value bound (each gets its wiring patch)
* 1 container, env flood     - one container with all the values as env entries
* update, object + old       - an UPDATE whose object and oldObject share the values
* empty arrays               - the values as empty arrays in a field nobody reads
* 3.8 MiB of annotations     - the body limit filled with long strings

Refused shapes: the 1.5-million-container review (4.3 MiB), and one container over the bound.
The honest GPU pod of the shared fixture is the baseline.
"""

from __future__ import annotations

import argparse
import ssl
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
from bench_extender import FIXTURES, stack

from rgpu_extender.reviewshape import MAX_POD_CONTAINERS, MAX_REVIEW_VALUES, count_values
from rgpu_extender.surfaces import WEBHOOK_MAX_BODY_BYTES

TARGET_MS = 100.0
"""The CPU one accepted review may cost at most, however it is shaped."""

Json = dict[str, Any]


def review(obj: Json, operation: str = "CREATE", old: Json | None = None) -> Json:
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "d2b7f0a4-9c3e-4f1b-8a6d-5e4c3b2a1f09",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml-team",
            "name": "p",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        },
    }


def pod(containers: list[Json], **spec: Any) -> Json:
    meta = {"name": "p", "namespace": "ml-team"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": containers, **spec},
    }


def container(index: int, env: int = 0, *, gpu: bool = True) -> Json:
    limits = {"nvidia.com/remote-gpu": "1"} if gpu else {}
    body: Json = {"name": f"c{index}", "image": "busybox", "resources": {"limits": limits}}
    if env:
        body["env"] = [{"name": f"E{j}", "value": "v"} for j in range(env)]
    return body


def shapes() -> dict[str, tuple[bytes, bool]]:
    """Each shape's body and whether the webhook should accept it."""
    room = MAX_REVIEW_VALUES - 2000
    annotated = pod([container(0)])
    annotated["metadata"]["annotations"] = {f"a{i}": "x" * 1000 for i in range(3900)}
    built = {
        "honest GPU pod (fixture)": (
            (FIXTURES / "admission-review-pod-create.json").read_bytes(),
            True,
        ),
        "256 GPU containers x env": (
            orjson.dumps(
                review(
                    pod(
                        [
                            container(i, room // (MAX_POD_CONTAINERS * 3))
                            for i in range(MAX_POD_CONTAINERS)
                        ]
                    )
                )
            ),
            True,
        ),
        "1 container, env flood": (orjson.dumps(review(pod([container(0, room // 3)]))), True),
        "update, object + old": (
            orjson.dumps(
                review(pod([container(0, room // 6)]), "UPDATE", pod([container(0, room // 6)]))
            ),
            True,
        ),
        "empty arrays": (orjson.dumps(review(pod([container(0)], x=[[]] * (room // 2)))), True),
        "3.8 MiB of annotations": (orjson.dumps(review(annotated)), True),
        "1.5M containers (refused)": (
            orjson.dumps(review(pod([{}] * 1_500_000))),
            False,
        ),
        f"{MAX_POD_CONTAINERS + 1} containers (refused)": (
            orjson.dumps(review(pod([container(i) for i in range(MAX_POD_CONTAINERS + 1)]))),
            False,
        ),
    }
    for name, (body, _) in built.items():
        if len(body) > WEBHOOK_MAX_BODY_BYTES:
            raise SystemExit(f"{name}: {len(body)} bytes is over the body limit; fix the bench")
    return built


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def server_cpu() -> Callable[[], float]:
    """CPU seconds of the thread serving the webhook (this, the main thread)."""
    clock = time.pthread_getcpuclockid(threading.get_ident())
    return lambda: time.clock_gettime(clock)


def send(url: str, ca_file: str, body: bytes) -> httpx.Response:
    verify = ssl.create_default_context(cafile=ca_file)
    with httpx.Client(verify=verify, trust_env=False, timeout=60) as client:
        return client.post(
            f"{url}/mutate", content=body, headers={"content-type": "application/json"}
        )


async def figure(
    url: str, ca_file: str, body: bytes, accepted: bool, rounds: int
) -> tuple[float, float, str]:
    cpu = server_cpu()
    samples, wall, outcome = [], [], ""
    for _ in range(rounds):
        before, started = cpu(), time.perf_counter()
        reply = await anyio.to_thread.run_sync(send, url, ca_file, body)
        samples.append((cpu() - before) * 1000)
        wall.append((time.perf_counter() - started) * 1000)
        allowed = reply.status_code == 200 and reply.json()["response"]["allowed"] is True
        outcome = "accepted" if allowed else f"refused ({reply.status_code})"
        if allowed != accepted:
            raise SystemExit(
                f"expected {'acceptance' if accepted else 'refusal'}, got {reply.text[:300]}"
            )
    return statistics.median(samples), statistics.median(wall), outcome


async def main(rounds: int) -> None:
    built = shapes()
    with tempfile.TemporaryDirectory() as directory:
        async with stack(Path(directory)) as (_, tls, _sim, ca):
            ca_file = str(Path(directory) / "ca.pem")
            ca.cert_pem.write_to_path(ca_file)
            print(f"load average {load_average()}; {rounds} rounds each")
            print(
                f"{'shape':<30}{'MiB':>6}{'values':>9}{'server CPU ms':>15}{'wall ms':>9}"
                f"{'target':>8}  ok  outcome"
            )
            for name, (body, accepted) in built.items():
                cpu_ms, wall_ms, outcome = await figure(tls, ca_file, body, accepted, rounds)
                mark = "yes" if cpu_ms <= TARGET_MS else "NO"
                print(
                    f"{name:<30}{len(body) / 2**20:>6.2f}{count_values(body):>9}{cpu_ms:>15.1f}"
                    f"{wall_ms:>9.1f}{TARGET_MS:>8.0f}  {mark:<3} {outcome}"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    anyio.run(main, options.rounds, backend_options={"use_uvloop": True})
