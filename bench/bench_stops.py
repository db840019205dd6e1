"""Stop times: how long each service takes to exit after SIGTERM, and ``rgpu up`` after its own.

Run: ``python3 -m uv run --no-sync python bench/bench_stops.py [--servers 20]``

Figures (target: every figure under 5 s, so a service's terminating pod never sits out its grace
period):

* service <name>  - the whole system running on the embedded cluster (long-polls between the
  services held open, discovery probing every lupine server each second): SIGTERM to one
  service process, time until it has exited; then it is started again for the next one
* rgpu up SIGTERM - ``rgpu up --sim`` as a child process: SIGTERM to it, time until the CLI
  and every service process it started are gone
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from rgpu_sim.processes import wait_ready
from rgpu_sim.stack import SERVICES, StackOptions, run_stack
from rgpu_sim.up import free_offset

TARGET_SECONDS = 5.0


async def _service_stops(servers: int) -> dict[str, float]:
    figures = {}
    async with run_stack(StackOptions(servers=servers, clients=4, work_dir=_logs())) as stack:
        await anyio.sleep(2.0)
        for name in SERVICES:
            process = stack.services[name]
            assert process.process is not None
            started = time.monotonic()
            process.process.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(process.process.wait)
            figures[name] = time.monotonic() - started
            _show(f"service {name}", figures[name])
            process.start()
            await wait_ready(process, timeout=120)
            await anyio.sleep(1.0)
    return figures


def _logs() -> Path:
    return Path(tempfile.mkdtemp(prefix="bench-stops-"))


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _up_stop(servers: int) -> tuple[float, float]:
    # Ports and a work directory of its own: another stack may run on this machine.
    offset = free_offset(random.randrange(100, 50_000, 100))
    work = tempfile.mkdtemp(prefix="bench-stops-")
    args = ["up", "--sim", "--servers", str(servers), "--port-offset", str(offset)]
    cli = subprocess.Popen(
        [sys.executable, "-m", "rgpu_cli", *args, "--work-dir", work],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert cli.stdout is not None
    for line in cli.stdout:
        if "stops everything" in line:
            break
    time.sleep(2.0)
    services = _children(cli.pid)
    started = time.monotonic()
    cli.send_signal(signal.SIGTERM)
    cli.wait(timeout=120)
    cli_exit = time.monotonic() - started
    while any(map(_alive, services)) and time.monotonic() - started < 120:
        time.sleep(0.01)
    return cli_exit, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=20)
    args = parser.parse_args()
    anyio.run(_service_stops, args.servers)
    cli_exit, all_gone = _up_stop(args.servers)
    _show("rgpu up SIGTERM (CLI exit)", cli_exit)
    _show("rgpu up SIGTERM (all gone)", all_gone)


def _show(name: str, seconds: float) -> None:
    verdict = "ok" if seconds < TARGET_SECONDS else "OVER"
    print(f"{name:<30} {seconds:6.2f} s   (target < {TARGET_SECONDS:g} s) {verdict}", flush=True)


if __name__ == "__main__":
    main()
