"""The README's walk-throughs run as written, so they cannot rot: every ```sh block that follows
a ``<!-- walkthrough: NAME -->`` line belongs to walk-through NAME, and the blocks of one name
run in README order as one bash script (``set -euo pipefail``: a failing command fails the
test). A comment line ``#> text`` in a block is output the reader should see: the test checks
that it appeared. The README's picture is checked to be what its documented command draws.

What the test changes, and only that, so the walk-throughs can run on a machine other stacks
share:

* ``make setup`` is skipped: the suite runs in the environment it made;
* the services' well-known ports (6443, 8081, 8082, 8083, 9400, 8443) move by one free offset,
  and ``rgpu up --sim`` is given that ``--port-offset``;
* ``TMPDIR`` is the test's own directory, so ``rgpu up``'s default work directory is too;
* the script runs in a process group of its own, killed at the end: what a block starts in
  the background with ``&`` does not outlive it.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rgpu_cli.main import app
from rgpu_sim.up import DEFAULT_PORTS, free_offset
from rgpu_testkit import flat

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKER = re.compile(r"^<!-- walkthrough: ([\w-]+) -->\n```sh\n(.*?)^```", re.M | re.S)
PORTS = re.compile(r"\b(" + "|".join(str(p) for p in sorted(set(DEFAULT_PORTS.values()))) + r")\b")
IMAGE = re.compile(r"!\[[^\]]*\]\((docs/images/[\w.-]+\.svg)\)")


def walkthroughs(text: str) -> dict[str, str]:
    """Walk-through name → its blocks joined in README order."""
    found: dict[str, list[str]] = {}
    for name, block in MARKER.findall(text):
        found.setdefault(name, []).append(block)
    return {name: "".join(blocks) for name, blocks in found.items()}


def shifted(script: str, offset: int) -> str:
    """``script`` as the test runs it: see the module docstring."""
    lines = [line for line in script.splitlines() if line.strip() != "make setup"]
    moved = PORTS.sub(lambda m: str(int(m.group(1)) + offset), "\n".join(lines))
    return moved.replace("rgpu up --sim", f"rgpu up --sim --port-offset {offset}")


def expected(script: str) -> list[str]:
    return [line.split("#>", 1)[1].strip() for line in script.splitlines() if "#>" in line]


def run_walkthrough(name: str, tmp_path: Path, timeout: float) -> str:
    script = walkthroughs(README.read_text())[name]
    offset = free_offset(random.randrange(1_000, 50_000, 100))
    assert offset is not None, "no free port offset on this machine"
    env = {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "200"}
    env = {k: v for k, v in env.items() if not k.startswith(("RGPU_", "KUBECONFIG"))}
    body = "set -euo pipefail\n" + shifted(script, offset)
    process = subprocess.Popen(
        ["bash", "-c", body],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        _stop_group(process)
    assert process.returncode == 0, f"walk-through {name} failed:\n{output}"
    for fragment in expected(script):
        assert flat(fragment) in flat(output), f"{fragment!r} not in the output:\n{output}"
    return output


def _stop_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_the_readme_marks_its_walkthroughs() -> None:
    assert set(walkthroughs(README.read_text())) == {"sim", "one-service", "server-policies"}


def test_the_port_shift_moves_every_well_known_port_and_rgpu_up() -> None:
    script = "make setup\nrgpu up --sim --detach\ncurl http://127.0.0.1:8081/x --port 6443\n"
    assert shifted(script, 100) == (
        "rgpu up --sim --port-offset 100 --detach\ncurl http://127.0.0.1:8181/x --port 6543"
    )


@pytest.mark.timeout(900)
def test_the_simulated_cluster_walkthrough_runs_as_written(tmp_path: Path) -> None:
    """Quick start, a pod of one's own, status and explain, two teams queued behind the gate
    (a quota, `rgpu queue`, `rgpu explain`), then the preemption walk-through on the same
    one-server stack, and `rgpu down`."""
    output = run_walkthrough("sim", tmp_path, timeout=840)
    assert "stopped the stack" in output


@pytest.mark.timeout(300)
def test_the_server_policies_walkthrough_runs_as_written(tmp_path: Path) -> None:
    """`rgpu up --sim --server-policies`: the holder gets in, a copycat pod is reset, a deleted
    policy is put back, the old holder is reset after release, discovery still probes."""
    output = run_walkthrough("server-policies", tmp_path, timeout=240)
    assert "stopped the stack" in output


@pytest.mark.timeout(300)
def test_running_one_service_runs_as_written(tmp_path: Path) -> None:
    output = run_walkthrough("one-service", tmp_path, timeout=240)
    assert '"servers"' in output


def test_the_readmes_picture_is_what_its_documented_command_draws(tmp_path: Path) -> None:
    text = README.read_text()
    (image,) = IMAGE.findall(text)
    command = f"rgpu simulate sim/examples/mixed-workload.yaml --timeline {image}"
    assert command in text, "the README must say how its picture is made"
    drawn = tmp_path / "timeline.svg"
    args = ["simulate", str(ROOT / "sim/examples/mixed-workload.yaml"), "--timeline", str(drawn)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert drawn.read_text() == (ROOT / image).read_text(), f"regenerate it: {command}"
