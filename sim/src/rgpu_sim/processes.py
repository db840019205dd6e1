"""``rgpu up``, the demo and the end-to-end tests run the four services as real,
separate processes over real HTTP — the way they run in a cluster — and must start them, wait for
them to be ready, kill and restart them, and always clean them up — however the command that
started them ends. Two mechanisms make "always" hold: the services of one stack share a process
group of their own (``ProcessGroup``), so one signal stops all of them at once and a terminal's
Ctrl-C reaches only the command, which then stops them itself; and each service asks the kernel
for SIGKILL when the command dies (Linux ``PR_SET_PDEATHSIG``), which covers the command being
killed outright, when no code of ours runs. The command can ask the same for itself
(``die_with_parent``), so stopping the ``uv run`` (or shell) that started it stops it too."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

import anyio
import httpx

__all__ = [
    "STOP_GRACE_SECONDS",
    "STOP_SIGNALS",
    "ProcessGroup",
    "ServiceProcess",
    "die_with_parent",
    "free_port",
    "run_until_stopped",
    "wait_ready",
]

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, a polite kill, a closed terminal: each must unwind and stop every service."""

STOP_GRACE_SECONDS = 8.0
"""SIGTERM to SIGKILL: services exit within about 5 s of SIGTERM; this is for a wedged one."""

_PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send this process ``sig`` when its parent ends; False off Linux.

    The parent here is the thread that started this process, so services must be started
    from the event loop's thread, never from a worker thread that may end first.
    """
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


def _child_setup(parent: int) -> Callable[[], None]:
    # Looked up before the fork: the child should do as little as it can before exec.
    prctl = _prctl()

    def setup() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # If the parent died before the request was made, no signal will come: leave now
        # rather than run orphaned.
        if os.getppid() != parent:
            os._exit(1)

    return setup


LOWEST_PORT = 10_000
"""Ports handed out start here, above the well-known and registered ports services use."""
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    """Where the kernel starts picking local ports for outgoing connections (Linux's default
    32768 when the range cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PortPicker:
    """Distinct local ports, each free when handed out, for services that bind them a second
    or so later (a Python process starting).

    They come from below the kernel's ephemeral range: a port the kernel picked there can be
    taken in that second as the local end of any outgoing connection, and a service then
    failed to start with "Address already in use" (seen once in a test run). Successive ports
    of one picker never repeat, so the services of one stack cannot be handed the same port.
    """

    __slots__ = ("_high", "_host", "_low", "_next")

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._low, self._high = LOWEST_PORT, _ephemeral_low()
        span = self._high - self._low
        self._next = self._low + random.SystemRandom().randrange(span) if span > 0 else None

    def take(self) -> int:
        """The next free port (one the kernel picks, if no range is left below its own)."""
        if self._next is None:
            return _kernel_port(self._host)
        span = self._high - self._low
        for _ in range(span):
            port = self._next
            self._next = self._low + (port + 1 - self._low) % span
            if _bindable(self._host, port):
                return port
        return _kernel_port(self._host)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, below the ephemeral range (see ``PortPicker``)."""
    return PortPicker(host).take()


@dataclass(slots=True)
class ProcessGroup:
    """The process group the services of one stack share; made by its first member."""

    pgid: int | None = None
    members: list[subprocess.Popen[bytes]] = field(default_factory=list)
    """Every process started here that may still run (ended ones are dropped on spawn)."""

    def spawn(
        self, args: Sequence[str], *, env: Mapping[str, str], log: IO[bytes]
    ) -> subprocess.Popen[bytes]:
        """Start ``args`` in this group, to die with this process, output to ``log``."""
        self.members = self._alive()
        try:
            process = _popen(args, env, log, self.pgid if self.members else 0)
        except PermissionError:
            # Members that ended unseen took the group with them: start a new one.
            process = _popen(args, env, log, 0)
            self.members = []
        if not self.members:
            self.pgid = process.pid
        self.members.append(process)
        return process

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the group, only while a member lives (a pgid may otherwise be reused)."""
        if self.pgid is not None and self._alive():
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass

    async def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM to every member at once, SIGKILL to what is left after ``grace`` seconds.

        Shielded: a stop usually runs while the command is being cancelled, and without the
        shield the first wait would end it, leaving the members to a bare SIGKILL when this
        process exits. It is bounded by the two ``grace`` waits.
        """
        with anyio.CancelScope(shield=True):
            self.signal(signal.SIGTERM)
            await self._ended(grace)
            self.signal(signal.SIGKILL)
            await self._ended(grace)

    async def _ended(self, timeout: float) -> None:
        # Polls instead of blocking in ``wait``: the event loop may be serving the simulated
        # apiserver the members talk to while they stop.
        with anyio.move_on_after(timeout):
            while self._alive():  # noqa: ASYNC110 (a child's exit has no anyio event)
                await anyio.sleep(0.02)

    def _alive(self) -> list[subprocess.Popen[bytes]]:
        return [process for process in self.members if process.poll() is None]


def _popen(
    args: Sequence[str], env: Mapping[str, str], log: IO[bytes], group: int | None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        process_group=group,
        preexec_fn=_child_setup(os.getpid()),
    )


@dataclass(slots=True, kw_only=True)
class ServiceProcess:
    """One ``python -m rgpu_<service>`` child with its environment and log file."""

    service: str
    env: Mapping[str, str]
    log_dir: Path
    url: str
    health_url: str | None = None
    """Where the readiness probe asks (``url`` when None): the extender's webhook listener when
    its scheduler listener requires a client certificate, as the kubelet probes it in k8s/."""
    verify: ssl.SSLContext | bool = True
    """How the probe verifies TLS: a context trusting the stack's own CA, or True."""
    group: ProcessGroup = field(default_factory=ProcessGroup)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.service}.log"

    def start(self) -> None:
        """Spawn the process (appending to its log)."""
        self.starts += 1
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.process = self.group.spawn(
                [sys.executable, "-m", f"rgpu_{self.service}"], env=env, log=log
            )

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the process with ``sig`` (SIGKILL: no chance to clean up), SIGKILL after
        ``STOP_GRACE_SECONDS``, and reap it."""
        for then in (sig, signal.SIGKILL):
            if self.process is None or self.process.poll() is not None:
                return
            self.process.send_signal(then)
            with anyio.move_on_after(STOP_GRACE_SECONDS):
                while self.alive():  # noqa: ASYNC110 (a child's exit has no anyio event)
                    await anyio.sleep(0.02)

    async def stop(self) -> None:
        """Graceful stop: SIGTERM, then SIGKILL after a grace period."""
        await self.kill(signal.SIGTERM)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The end of the log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


READY_TIMEOUT_SECONDS = 90.0
"""A service imports in about 1 s of CPU, but four starting together on a busy 2-core machine
have taken 30 s of wall time."""


async def wait_ready(
    service: ServiceProcess, timeout: float = READY_TIMEOUT_SECONDS, *, verify: bool = True
) -> None:
    """Wait until ``/readyz`` answers 200; raise with the log tail if it dies or times out.

    Asynchronous on purpose: the simulated apiserver the service is listing from runs in the
    caller's event loop, so blocking here would keep the service from ever becoming ready.
    """
    deadline = time.monotonic() + timeout
    url = service.health_url or service.url
    trust = service.verify if verify else False
    async with httpx.AsyncClient(timeout=1.0, verify=trust) as client:
        while time.monotonic() < deadline:
            if not service.alive():
                raise RuntimeError(f"{service.service} exited:\n{service.tail()}")
            try:
                if (await client.get(f"{url}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await anyio.sleep(0.1)
    raise RuntimeError(f"{service.service} not ready after {timeout:.0f}s:\n{service.tail()}")


async def run_until_stopped(work: Callable[[], Awaitable[T]]) -> T | None:
    """``work``'s result, or None when a stop signal came first (``work`` is then cancelled,
    so its cleanup — stopping the services it started — runs before this returns)."""
    outcome: list[T] = []
    # Listening before ``work`` starts: a signal while the services start must unwind too.
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                outcome.append(await work())
                tg.cancel_scope.cancel()

            tg.start_soon(run)
            async for _ in signals:
                tg.cancel_scope.cancel()
                break
    return outcome[0] if outcome else None
