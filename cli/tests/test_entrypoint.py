"""The ``rgpu`` console entry point as a shell runs it: the library's own log warnings do not
leak onto the terminal beside the command's one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rgpu_testkit import flat

pytestmark = pytest.mark.process


def test_explain_without_an_apiserver_says_what_to_set_and_nothing_else(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RGPU_", "KUBE"))}
    env |= {"HOME": str(tmp_path), "COLUMNS": "200"}  # no ~/.kube/config either
    done = subprocess.run(
        [sys.executable, "-m", "rgpu_cli", "explain", "default/x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    output = done.stdout + done.stderr
    assert "WARNING" not in output  # kubernetes_asyncio's "Config not found: ~/.kube/config"
    assert "Traceback" not in output
    assert "set RGPU_KUBE_URL or KUBECONFIG" in flat(output)
