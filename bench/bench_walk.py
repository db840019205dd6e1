"""The booking walk: which allocator modules one ``POST /v1/allocations`` moves between.

A reader following a booking through the code should meet each concept once, not be sent back
and forth between modules. This traces one real booking (the allocator in process, its
lifespan and clients real, against the simulated apiserver over loopback and a discovery that
serves one idle server) call by call, and counts, among the allocator's own modules:

* a **move**: a call from one module into another (a module calling itself is not a move; a
  library calling back into the allocator, as placement calls the ``Occupancy``, is a move from
  the allocator module that called the library);
* a **stay**: consecutive moves into one module;
* a **return**: a stay in a module the walk had already left.

Target: at most 15 stays with at most 6 returns. Also printed, for scale: the same count over
every call (a module calling its own helpers then counts too). ``--show`` prints the walk.

Run: ``python3 -m uv run --no-sync python bench/bench_walk.py [--show]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
from asgi_lifespan import LifespanManager
from bench_allocator import (
    base_env,
    fixture_pod,
    make_fleet,
    seed_pods,
    serving_discovery,
    wait_fleet,
)

import rgpu_allocator
from rgpu_allocator import create_app
from rgpu_allocator.settings import AllocatorSettings
from rgpu_contracts import AllocationRequest, ContainerKind, ContainerRequest, PodRef, PodUID
from rgpu_kubesim import ApiOptions, run_apiserver

STAYS_TARGET = 15
RETURNS_TARGET = 6
SOURCE = str(Path(rgpu_allocator.__file__).resolve().parent)


@dataclass(frozen=True, slots=True)
class Call:
    module: str
    name: str
    caller: str | None
    """The module of the nearest allocator frame below it (``None``: the walk's start)."""


@dataclass(frozen=True, slots=True)
class Walk:
    stays: tuple[tuple[str, tuple[str, ...]], ...]
    returns: int

    @property
    def modules(self) -> int:
        return len({module for module, _ in self.stays})

    def lines(self) -> Iterator[str]:
        seen: set[str] = set()
        for module, names in self.stays:
            mark = "R" if module in seen else " "
            seen.add(module)
            yield f"  {mark} {module}: {', '.join(names)}"


def walk_of(calls: Sequence[Call]) -> Walk:
    stays: list[tuple[str, list[str]]] = []
    for call in calls:
        if stays and stays[-1][0] == call.module:
            if call.name not in stays[-1][1]:
                stays[-1][1].append(call.name)
        else:
            stays.append((call.module, [call.name]))
    seen: set[str] = set()
    returns = 0
    for module, _ in stays:
        returns += module in seen
        seen.add(module)
    return Walk(stays=tuple((m, tuple(n)) for m, n in stays), returns=returns)


class Tracer:
    """Records the allocator's calls made by one task, each with its caller's module."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._frames: dict[int, tuple[types.FrameType, str]] = {}
        self.calls: list[Call] = []

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call" or asyncio.current_task() is not self._task:
            return
        code = frame.f_code
        if not code.co_filename.startswith(SOURCE) or id(frame) in self._frames:
            return  # not the allocator's, or a coroutine resuming
        module = Path(code.co_filename).stem
        self._frames[id(frame)] = (frame, module)  # kept alive: ids are not reused meanwhile
        self.calls.append(Call(module, code.co_qualname, self._caller(frame.f_back)))

    def _caller(self, frame: types.FrameType | None) -> str | None:
        while frame is not None:
            found = self._frames.get(id(frame))
            if found is not None:
                return found[1]
            frame = frame.f_back
        return None


async def traced_booking() -> list[Call]:
    fleet = make_fleet(1, 2)
    async with run_apiserver(options=ApiOptions()) as sim:
        meta = seed_pods(sim, 1, fixture_pod())[0]["metadata"]
        pod = PodRef(uid=PodUID(meta["uid"]), namespace=meta["namespace"], name=meta["name"])
        request = AllocationRequest(
            pod=pod, containers=(ContainerRequest(name="main", kind=ContainerKind.APP, count=1),)
        )
        async with serving_discovery(fleet) as url:
            env = {k: v for k, v in base_env(sim.url, url).items() if k.startswith("RGPU_")}
            app = create_app(AllocatorSettings.from_env(env))
            async with LifespanManager(app, startup_timeout=60) as manager:
                transport = httpx.ASGITransport(app=manager.app)
                async with httpx.AsyncClient(transport=transport, base_url="http://a") as client:
                    await wait_fleet(client)
                    task = asyncio.current_task()
                    assert task is not None
                    tracer = Tracer(task)
                    sys.setprofile(tracer)
                    try:
                        answer = await client.post("/v1/allocations", json=request.to_dict())
                    finally:
                        sys.setprofile(None)
    if answer.status_code != 200:
        raise SystemExit(f"the traced booking failed: {answer.status_code} {answer.text[:200]}")
    return tracer.calls


def report(calls: Sequence[Call], *, show: bool) -> None:
    moves = walk_of([c for c in calls if c.caller != c.module])
    every = walk_of(calls)
    ok = moves.returns <= RETURNS_TARGET and len(moves.stays) <= STAYS_TARGET
    print(
        f"{'booking walk, moves between modules':<38} {len(moves.stays):4d} stays  "
        f"target <= {STAYS_TARGET}  {'ok' if ok else 'MISSED'} "
        f"({moves.returns} returns, target <= {RETURNS_TARGET}; {moves.modules} modules)"
    )
    print(
        f"{'booking walk, every call':<38} {len(every.stays):4d} stays  "
        f"({every.returns} returns; {len(calls)} calls, for scale)"
    )
    if show:
        print("moves between modules (R: back in a module the walk had left):")
        print("\n".join(moves.lines()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print the walk, stay by stay")
    args = parser.parse_args()
    # The in-process allocator runs without auth, as the other benchmarks do; say it once here.
    logging.getLogger("rgpu_runtime").setLevel(logging.ERROR)
    report(anyio.run(traced_booking), show=args.show)


if __name__ == "__main__":
    main()
