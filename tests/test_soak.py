"""``rgpu soak`` in CI: a short soak per granularity, with replicas and the standard faults,
must end with every verdict line PASS and exit 0. The wake-up latency is printed, not judged
here (``--wake-limit-seconds 0``): on a shared 2-core machine a timing verdict measures the
machine; ``rgpu soak`` and ``make soak`` judge it. The priority mix is off here
(``--priority-mix 0``): its checks are judged by ``rgpu soak`` runs and unit-tested on recorded
evidence (``cli/tests/test_soak_priority.py``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CHECK_LINE = re.compile(r"^(PASS|FAIL) ", re.MULTILINE)
CHECKS = 13
"""Nine of correctness, four of scaling (soak_scaling); the discovery two pass once discovery
shards its probing and publishes one fleet."""


@pytest.mark.parametrize(("granularity", "seed"), [("server", 3), ("card", 4)])
def test_a_short_soak_with_faults_passes_every_check(granularity: str, seed: int) -> None:
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
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=560, env={**os.environ, "COLUMNS": "200"}
    )
    lines = [m.group(0) + line for m, line in _check_lines(done.stdout)]
    assert len(lines) == CHECKS, done.stdout + done.stderr[-3000:]
    assert all(line.startswith("PASS") for line in lines), done.stdout
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert re.search(r"wake-up .* p50 \d+\.\d\ds, p99 \d+\.\d\ds", done.stdout), done.stdout


def _check_lines(out: str) -> list[tuple[re.Match[str], str]]:
    return [(m, out[m.end() : out.find("\n", m.end())]) for m in CHECK_LINE.finditer(out)]
