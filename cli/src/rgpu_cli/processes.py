"""The demo and the end-to-end tests run the four services as real,
separate processes over real HTTP — the way they run in a cluster — and must start them, wait for
them to be ready, kill and restart them, and always clean them up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx

__all__ = ["ServiceProcess", "free_port", "wait_ready"]


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that was free a moment ago (the service binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(slots=True, kw_only=True)
class ServiceProcess:
    """One ``python -m rgpu_<service>`` child with its environment and log file."""

    service: str
    env: Mapping[str, str]
    log_dir: Path
    url: str
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    _log: object = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.service}.log"

    def start(self) -> None:
        """Spawn the process (appending to its log)."""
        self.starts += 1
        log = self.log_path.open("ab")
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", f"rgpu_{self.service}"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the process with ``sig`` (SIGKILL: no chance to clean up) and reap it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)

    def stop(self) -> None:
        """Graceful stop: SIGTERM, then SIGKILL after a grace period."""
        self.kill(signal.SIGTERM)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The end of the log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


async def wait_ready(
    service: ServiceProcess, timeout: float = 30.0, *, verify: bool = True
) -> None:
    """Wait until ``/readyz`` answers 200; raise with the log tail if it dies or times out.

    Asynchronous on purpose: the simulated apiserver the service is listing from runs in the
    caller's event loop, so blocking here would keep the service from ever becoming ready.
    """
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=1.0, verify=verify) as client:
        while time.monotonic() < deadline:
            if not service.alive():
                raise RuntimeError(f"{service.service} exited:\n{service.tail()}")
            try:
                if (await client.get(f"{service.url}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await anyio.sleep(0.1)
    raise RuntimeError(f"{service.service} not ready after {timeout:.0f}s:\n{service.tail()}")
