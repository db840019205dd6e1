"""However the command holding a stack ends, no service process may outlive it.

The command here is a small stand-in built from the same shared pieces ``rgpu up`` and
``rgpu demo`` use (``die_with_parent``, ``run_until_stopped``, a ``ProcessGroup`` stopped in
the cleanup), with sleepers for services, so each way of stopping costs a second, not a stack
start. ``test_rgpu_up_through_uv_run_leaves_no_service_on_sigterm`` runs the real thing once.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from rgpu_kubesim import run_apiserver
from rgpu_kubesim.fleet import FleetSpec, plan_fleet
from rgpu_sim.processes import ServiceProcess, free_port, wait_ready
from rgpu_sim.up import free_offset

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]

COMMAND = """
import os, sys
import anyio
from rgpu_sim.processes import ProcessGroup, die_with_parent, run_until_stopped

async def hold():
    group = ProcessGroup()
    try:
        with open(os.devnull, "wb") as log:
            for _ in range(2):
                group.spawn([sys.executable, "-c", "import time; time.sleep(600)"],
                            env=os.environ, log=log)
        print(os.getpid(), *(p.pid for p in group.members), flush=True)
        await anyio.sleep_forever()
    finally:
        await group.stop()

die_with_parent()
anyio.run(run_until_stopped, hold)
"""

GONE_WITHIN = 15.0
"""Seconds to wait for every process to end: a deadline for a hang, not a speed check."""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids: Sequence[int]) -> list[int]:
    deadline = time.monotonic() + GONE_WITHIN
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def _started(args: Sequence[str]) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    process = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    pids: list[int] = []
    try:
        assert process.stdout is not None
        pids = [int(word) for word in process.stdout.readline().split()]
        assert len(pids) == 3, f"the command did not start (exit {process.poll()})"
        yield process, pids
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name
)
def test_no_service_outlives_the_command_however_it_is_signalled(sig: signal.Signals) -> None:
    for process, (command, *services) in _started([sys.executable, "-c", COMMAND]):
        process.send_signal(sig)
        assert _wait_gone([command, *services]) == []
        if sig != signal.SIGKILL:
            assert process.wait() == 0  # unwound and stopped its services itself


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name
)
def test_no_service_outlives_the_uv_run_that_started_the_command(sig: signal.Signals) -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH: make setup installs it (python3 -m pip install uv)")
    args = [uv, "run", "--no-sync", "python", "-c", COMMAND]
    for process, pids in _started(args):
        process.send_signal(sig)
        assert _wait_gone(pids) == []


async def _hanging_lupine(address: str, connected: anyio.Event, tg: anyio.abc.TaskGroup) -> int:
    """A lupine port that accepts and never answers, so discovery's probe stays in flight."""
    listener = await anyio.create_tcp_listener(local_host=address, local_port=0)

    async def hold(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            connected.set()
            await anyio.sleep_forever()

    await tg.start(partial(_serve, listener, hold))
    return int(listener.extra(anyio.abc.SocketAttribute.local_port))


async def _serve(
    listener: anyio.abc.Listener[anyio.abc.SocketStream],
    handler: Callable[[anyio.abc.SocketStream], Awaitable[None]],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    async with listener:
        task_status.started()
        await listener.serve(handler)


@pytest.mark.anyio
async def test_discovery_exits_within_5s_of_sigterm_with_a_long_poll_and_probes_in_flight(
    tmp_path: Path,
) -> None:
    probing = anyio.Event()
    plan = plan_fleet(FleetSpec(servers=1, clients=1, seed=3))
    async with run_apiserver() as sim, anyio.create_task_group() as tg:
        # Discovery's membership and probe-state Leases live in the system namespace.
        sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
        for server in plan.servers:
            port = await _hanging_lupine(server.address, probing, tg)
            sim.store.create("nodes", server.node(port=port, now=datetime.now(UTC)))
        discovery = _discovery(sim.url, tmp_path)
        try:
            discovery.start()
            await wait_ready(discovery, timeout=50)
            async with httpx.AsyncClient(base_url=discovery.url) as client:
                revision = (await client.get("/v1/fleet")).headers["x-rgpu-revision"]
            target = f"/v1/fleet?since={revision}&wait=60"
            async with await _long_poll(discovery.url, target) as poll:
                await probing.wait()
                assert discovery.process is not None
                discovery.process.send_signal(signal.SIGTERM)
                with anyio.fail_after(5):  # the bound: gone within 5 s of SIGTERM
                    while discovery.alive():
                        await anyio.sleep(0.02)
                answer = await _read_to_end(poll)
            assert discovery.process.returncode == 0
            assert answer.startswith(b"HTTP/1.1 503 ")
            assert b'"code": "stopping"' in answer
        finally:
            await discovery.group.stop()
            tg.cancel_scope.cancel()


async def _long_poll(url: str, target: str) -> anyio.abc.SocketStream:
    """Send a GET on a raw connection and return once the server has read all of it."""
    port = int(url.rsplit(":", 1)[1])
    stream = await anyio.connect_tcp("127.0.0.1", port)
    await stream.send(f"GET {target} HTTP/1.1\r\nHost: discovery\r\n\r\n".encode())
    client_port = stream.extra(anyio.abc.SocketAttribute.local_port)
    # The server has the request once its side of the connection has nothing left unread
    # (/proc/net/tcp's rx_queue); only then does a SIGTERM meet a long-poll in flight.
    with anyio.fail_after(20):
        while _unread(port, client_port) != 0:
            await anyio.sleep(0.01)
    return stream


def _unread(server_port: int, client_port: int) -> int | None:
    local, remote = f"0100007F:{server_port:04X}", f"0100007F:{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            return int(fields[4].split(":")[1], 16)
    return None


async def _read_to_end(stream: anyio.abc.SocketStream) -> bytes:
    chunks = []
    with anyio.fail_after(5):
        try:
            while True:
                chunks.append(await stream.receive())
        except anyio.EndOfStream:
            pass
    return b"".join(chunks)


def _discovery(kube_url: str, log_dir: Path) -> ServiceProcess:
    port = free_port()
    env = {
        "RGPU_KUBE_URL": kube_url,
        "RGPU_LISTEN": f"127.0.0.1:{port}",
        "RGPU_PROBE_INTERVAL_SECONDS": "1",
        # Far longer than the bound: only cancelling the probe can let discovery exit in time.
        "RGPU_PROBE_TIMEOUT_SECONDS": "60",
        "RGPU_LOG_FORMAT": "json",
    }
    return ServiceProcess(
        service="discovery", env=env, log_dir=log_dir, url=f"http://127.0.0.1:{port}"
    )


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


SERVICES = ("allocator", "discovery", "extender", "metrics")


def _service_of(pid: int) -> str | None:
    """The service ``pid`` runs (``python -m rgpu_<service>``), or ``None``."""
    args = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    modules = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-m"]
    return next(
        (m.removeprefix("rgpu_") for m in modules if m.removeprefix("rgpu_") in SERVICES), None
    )


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_rgpu_up_through_uv_run_leaves_no_service_on_sigterm(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH: make setup installs it (python3 -m pip install uv)")
    # Other stacks run on this machine: ports of their own, and a work directory of its own.
    offset = free_offset(random.randrange(100, 50_000, 100))
    assert offset is not None
    args = [uv, "run", "--no-sync", "rgpu", "up", "--sim", "--servers", "1", "--clients", "1"]
    args += ["--port-offset", str(offset), "--work-dir", str(tmp_path)]
    env = {**os.environ, "COLUMNS": "300"}
    process = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    pids: list[int] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "stops everything" in line:
                break
        pids = _descendants(process.pid)
        assert sorted(filter(None, map(_service_of, pids))) == sorted(SERVICES)
        process.send_signal(signal.SIGTERM)
        assert _wait_gone(pids) == []
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
