"""A stack left running by ``rgpu up --sim`` is found again through its work directory, the
way kubectl finds a cluster through a kubeconfig: the directory holds the stack's pid, a
kubeconfig for kubectl and the services' URLs as shell exports (``env``), written once every
service is ready, plus every service's log. ``rgpu env`` prints the exports, ``rgpu down``
stops the stack, and a second ``rgpu up`` in the same directory is refused while the first
runs. The directory outlives the stack, so its logs can be read after it stopped."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StackDir", "StackDirError", "default_work_dir"]


class StackDirError(Exception):
    """A work directory cannot be used or holds no running stack; the message says why."""


def default_work_dir() -> Path:
    """``$TMPDIR/rgpu-up`` (``/tmp/rgpu-up``): the same every time, so a kubeconfig exported
    once keeps working after the stack restarts."""
    return Path(tempfile.gettempdir()) / "rgpu-up"


def _kubeconfig(apiserver_url: str) -> str:
    # kubesim serves plain HTTP on loopback and needs no credentials: no user entries.
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: rgpu-sim\n"
        f"  cluster: {{server: '{apiserver_url}'}}\n"
        "contexts:\n"
        "- name: rgpu-sim\n"
        "  context: {cluster: rgpu-sim, user: rgpu-sim, namespace: default}\n"
        "current-context: rgpu-sim\n"
        "users:\n"
        "- name: rgpu-sim\n"
        "  user: {}\n"
    )


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs and is an ``rgpu`` command (a recycled pid is someone else's)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"rgpu" in command


@dataclass(frozen=True, slots=True)
class StackDir:
    """The files of one ``rgpu up`` in ``path``."""

    path: Path

    @property
    def kubeconfig(self) -> Path:
        return self.path / "kubeconfig"

    @property
    def env_file(self) -> Path:
        return self.path / "env"

    @property
    def pid_file(self) -> Path:
        return self.path / "pid"

    @property
    def log(self) -> Path:
        """Where a detached ``rgpu up`` writes what it would print."""
        return self.path / "up.log"

    def running(self) -> int | None:
        """The pid of the stack running from here, if one is."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def claim(self) -> None:
        """Make the directory this process's; refused while another stack runs from it."""
        pid = self.running()
        if pid is not None and pid != os.getpid():
            raise StackDirError(
                f"a stack is already running from {self.path} (pid {pid}): `rgpu down` stops "
                "it; to run a second one beside it, give this one --work-dir and --port-offset"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.env_file.unlink(missing_ok=True)
            self.pid_file.write_text(f"{os.getpid()}\n")
        except OSError as exc:
            raise StackDirError(f"cannot use {self.path} as the work directory: {exc}") from exc

    def publish(self, apiserver_url: str, exports: Mapping[str, str]) -> None:
        """Write the kubeconfig, then the exports (whose presence means "ready")."""
        self.kubeconfig.write_text(_kubeconfig(apiserver_url))
        lines = "".join(f"export {key}={value}\n" for key, value in exports.items())
        partial = self.env_file.with_suffix(".partial")
        partial.write_text(lines)
        partial.replace(self.env_file)

    def release(self) -> None:
        """The stack stopped: it is no longer running from here (its logs stay)."""
        self.env_file.unlink(missing_ok=True)
        if self.running() == os.getpid():
            self.pid_file.unlink(missing_ok=True)

    def exports(self) -> str:
        """The running stack's exports; raises when none runs from here."""
        if self.running() is None or not self.env_file.is_file():
            where = "" if self.path == default_work_dir() else f" --work-dir {self.path}"
            raise StackDirError(
                f"no stack is running from {self.path}: start one with `rgpu up --sim{where}`"
            )
        return self.env_file.read_text()

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM the running stack and wait for it to end; its pid, or None if none ran."""
        pid = self.running()
        if pid is None:
            return None
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid):
            if time.monotonic() > deadline:
                raise StackDirError(f"the stack (pid {pid}) did not stop within {timeout:.0f}s")
            time.sleep(0.1)
        return pid
