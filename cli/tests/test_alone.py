"""The operator's package installed alone (``uv sync --package rgpu-cli --no-dev``): synced from
the lock with nothing but its own dependencies into an environment of its own, ``rgpu`` runs the
operator's commands, the simulator is not there, and the proving ground's commands say what to
install. (``.ci/check-members`` imports every module of it the same way.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` folder of an environment holding rgpu-cli and its dependencies only."""
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is needed to build the environment (make setup installs it)"
    environment = tmp_path_factory.mktemp("rgpu-cli-alone") / "venv"
    env = dict(os.environ, UV_PROJECT_ENVIRONMENT=str(environment))
    sync = [uv, "sync", "--locked", "--package", "rgpu-cli", "--no-dev", "--quiet"]
    done = subprocess.run(sync, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return environment / "bin"


def run(alone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RGPU_", "KUBE", "VIRTUAL"))}
    env["COLUMNS"] = "200"
    return subprocess.run(args, cwd=alone, env=env, capture_output=True, text=True, timeout=60)


def test_alone_the_simulator_and_the_services_are_not_installed(alone: Path) -> None:
    for module in ("rgpu_kubesim", "rgpu_sim", "rgpu_allocator", "rgpu_extender"):
        done = run(alone, str(alone / "python"), "-I", "-c", f"import {module}")
        assert done.returncode == 1, module
        assert "ModuleNotFoundError" in done.stderr


def test_alone_rgpu_offers_the_operators_commands(alone: Path) -> None:
    done = run(alone, str(alone / "rgpu"), "status", "--help")

    assert done.returncode == 0, done.stderr
    assert "--discovery-url" in done.stdout


def test_alone_rgpu_demo_says_the_proving_ground_is_not_installed(alone: Path) -> None:
    done = run(alone, str(alone / "rgpu"), "demo", "--pods", "5")

    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rgpu demo: the proving ground is not installed")


def test_alone_rgpu_loads_without_the_kubernetes_client_until_a_command_needs_it(
    alone: Path,
) -> None:
    # Importing kubernetes_asyncio took half a second of every `rgpu --help`, `status` and
    # `queue`, none of which talks to the apiserver.
    probe = "import sys, rgpu_cli.main; print('kubernetes_asyncio' in sys.modules)"
    done = run(alone, str(alone / "python"), "-I", "-c", probe)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
