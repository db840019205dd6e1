"""``rgpu soak`` in CI: a short soak per granularity on the gate path with the queue workload
(teams with quotas, gangs), and one on HAMi's filter path, with replicas and the standard
faults, must end with every verdict line PASS and exit 0. The wake-up latency is printed, not
judged here (``--wake-limit-seconds 0``): on a shared 2-core machine a timing verdict measures
the machine; ``rgpu soak`` and ``make soak`` judge it. The priority mix is off here
(``--priority-mix 0``): its checks are judged by ``rgpu soak`` runs and unit-tested on recorded
evidence (``sim/tests/test_soak_priority.py``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CHECK_LINE = re.compile(r"^(PASS|FAIL) ", re.MULTILINE)
CHECKS = {"gate": 21, "filter": 15}
"""Eleven of correctness (a lost server's holders told among them, and no request of rgpu's
accounts refused by the apiserver's RBAC) and four of scaling (soak_scaling) on both paths; on
the gate path three of admission (soak_admission) and three of the queue workload
(soak_queues)."""
WAKE_UPS = re.compile(
    r"wake-up \(capacity freed → bound\) +│ (?:p50 \d+\.\d\ds, p99 \d+\.\d\ds \((\d+) (.+?)\)"
    r"|none: no pod waited for capacity to free \(0 (.+?)\))"
)
"""The summary's wake-up row: figures where pods waited for capacity, else that none did."""


@pytest.mark.parametrize(
    ("granularity", "seed", "admission"),
    [("server", 3, "gate"), ("card", 4, "gate"), ("server", 5, "filter")],
)
def test_a_short_soak_with_faults_passes_every_check(
    granularity: str, seed: int, admission: str, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    command = [
        sys.executable,
        "-m",
        "rgpu_cli",
        "soak",
        "--pods",
        "200",
        "--servers",
        "6",
        "--granularity",
        granularity,
        "--seed",
        str(seed),
        "--wake-limit-seconds",
        "0",
        "--priority-mix",
        "0",
        "--trace",
        str(trace),
        "--admission",
        admission,
        "--queues",
        "standard" if admission == "gate" else "none",
    ]
    began = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=840, env={**os.environ, "COLUMNS": "200"}
    )
    elapsed = time.monotonic() - began
    lines = [m.group(0) + line for m, line in _check_lines(done.stdout)]
    assert len(lines) == CHECKS[admission], done.stdout + done.stderr[-3000:]
    assert all(line.startswith("PASS") for line in lines), done.stdout
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert_wake_ups_are_the_paths(done.stdout, admission)
    assert_trace_tells_each_pods_history(trace, done.stdout, gated=admission == "gate")
    assert_wall_time_is_the_runs(done.stdout, elapsed)


def assert_wake_ups_are_the_paths(stdout: str, admission: str) -> None:
    """The wake-up row names whose waits it measures on this path, with figures only when
    some pod waited for capacity."""
    found = WAKE_UPS.search(stdout)
    assert found is not None, stdout
    count, woken, none_of = found.groups()
    what = "gated pods admitted and bound" if admission == "gate" else "parked pods bound"
    assert (woken or none_of) == what, stdout
    assert count is None or int(count) > 0


def assert_wall_time_is_the_runs(stdout: str, elapsed: float) -> None:
    """The summary's wall time is the run's, start-up and drain included, cut into its phases;
    only the interpreter's start and the final stop are outside it. Each long wait was said."""
    found = re.search(
        r"wall time +│ ([\d.]+)s \(start-up ([\d.]+)s, workload ([\d.]+)s, "
        r"drain and checks ([\d.]+)s\)",
        stdout,
    )
    assert found is not None, stdout
    wall, *phases = (float(group) for group in found.groups())
    assert abs(wall - sum(phases)) < 0.5
    assert 0.6 * elapsed < wall < elapsed
    for step in ("waiting for allocator-1 to be ready", "draining: deleting", "judging"):
        assert step in stdout, stdout


def assert_trace_tells_each_pods_history(trace: Path, stdout: str, *, gated: bool) -> None:
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert f"trace: {len(lines)} pods' scheduling histories" in stdout
    assert 100 <= len(lines) <= 200  # the scheduler sees nearly every pod before any deletion
    assert any(pod["bound"] is not None for pod in lines)
    # What the Events said stands among the scheduler's steps, in time order.
    assert any(what == "event" for pod in lines for _, what, _ in pod["steps"])
    for pod in lines:
        assert [at for at, _, _ in pod["steps"]] == sorted(at for at, _, _ in pod["steps"]), pod
        steps = [step for step in pod["steps"] if step[1] != "event"]
        whats = [what for _, what, _ in steps]
        # On the gate path every pod waits behind rgpu's gate first (and a pod deleted there
        # is never queued).
        assert whats[0] == ("gated" if gated else "queued"), pod
        assert whats.count("attempt") == pod["attempts"], pod
        if pod["bound"] is not None:
            assert steps[-1][1:] == ["bound", pod["node"]], pod
    faults = [
        json.loads(line) for line in trace.with_suffix(".faults.jsonl").read_text().splitlines()
    ]
    assert faults and all(f["start"] is not None and f["target"] for f in faults), faults


def _check_lines(out: str) -> list[tuple[re.Match[str], str]]:
    return [(m, out[m.end() : out.find("\n", m.end())]) for m in CHECK_LINE.finditer(out)]
