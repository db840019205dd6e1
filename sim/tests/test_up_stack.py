"""``rgpu up --sim`` for real, in the foreground: the lines it prints work pasted into another
shell (kubectl through the kubeconfig it wrote, ``rgpu status`` through the exports); a pod
without a run time keeps running; a service that dies is reported with its log, and reaped;
the work directory and its logs stay after the stack stops."""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rgpu_sim.up import free_offset

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


class Output:
    """The command's stdout, line by line, readable with a deadline."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        assert process.stdout is not None
        self._stream = process.stdout
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stream:
            self._queue.put(line)

    def close(self) -> None:
        """Once the process ended: the reader has seen the end of the pipe; close it."""
        self._reader.join(timeout=10)
        self._stream.close()

    def until(self, text: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{text!r} not printed within {timeout}s:\n{''.join(self.lines)}"
                )
            try:
                self.lines.append(self._queue.get(timeout=left))
            except queue.Empty:
                continue
        return self.lines


def children(pid: int) -> dict[str, int]:
    """``rgpu_<service>`` child processes of ``pid``, by service."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and len(command) > 2:
            found[command[2].decode().removeprefix("rgpu_")] = int(entry.name)
    return found


def pasted(lines: list[str]) -> str:
    """The lines `up` offered to paste, as printed."""
    start = next(i for i, line in enumerate(lines) if "paste these lines" in line) + 1
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        block.append(line.rstrip("\n"))
    return "\n".join(block)


@pytest.mark.timeout(600)
def test_up_prints_lines_that_work_pasted_keeps_pods_running_and_reports_a_dead_service(
    tmp_path: Path,
) -> None:
    offset = free_offset(random.randrange(1_000, 50_000, 100))
    assert offset is not None
    work = tmp_path / "up"
    command = [sys.executable, "-m", "rgpu_cli", "up", "--sim", "--servers", "1", "--clients", "2"]
    command += ["--port-offset", str(offset), "--work-dir", str(work)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RGPU_", "KUBECONFIG"))}
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env | {"COLUMNS": "300"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = Output(process)
    try:
        lines = output.until("stops everything", timeout=420)
        block = pasted(lines)
        assert f"export KUBECONFIG={work}/kubeconfig" in block
        script = (
            block
            + """
kubectl apply -f examples/pod.yaml
kubectl wait --for=jsonpath='{.status.phase}'=Running pod/train --timeout=60s
sleep 7   # past the 5 s a simulated pod used to run
kubectl get pod train -o jsonpath='{.status.phase}'; echo
rgpu status -o json
"""
        )
        shell = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert shell.returncode == 0, shell.stdout + shell.stderr
        assert "\nRunning\n" in shell.stdout  # a pod without a run time runs until deleted
        assert '"holder": "default/train"' in shell.stdout

        services = children(process.pid)
        assert set(services) == {"discovery", "allocator", "extender", "metrics"}
        os.kill(services["discovery"], signal.SIGKILL)
        output.until("discovery was killed by SIGKILL", timeout=30)
        assert not Path(f"/proc/{services['discovery']}").exists()  # reaped, not a zombie
        assert any("discovery.log" in line for line in output.lines)

        process.send_signal(signal.SIGINT)
        output.until("logs kept in", timeout=60)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        output.close()
    assert (work / "discovery.log").is_file() and (work / "kubeconfig").is_file()
    assert not (work / "env").exists()  # the exports describe a stack that no longer runs
