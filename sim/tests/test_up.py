"""``rgpu up``, ``rgpu env`` and ``rgpu down`` as a newcomer meets them: refusals are one line
that names the port or directory and the fix, never a traceback; the work directory says
whether a stack runs. The whole stack's printed lines are tried, pasted into a shell, in
``test_up_stack.py``."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rgpu_cli.main import app
from rgpu_sim.stack_dir import StackDir
from rgpu_sim.up import DEFAULT_PORTS, free_offset, plan_ports
from rgpu_testkit import flat


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture
def rgpu_lookalike() -> Iterator[int]:
    """The pid of a live process whose command line mentions rgpu (a stack's, as far as the
    work directory can tell)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "rgpu"])
    yield process.pid
    process.kill()
    process.wait()


def up(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["up", "--sim", *args])
    return result.exit_code, result.output


def test_ports_default_to_the_services_own_and_move_together() -> None:
    assert plan_ports(0) == DEFAULT_PORTS
    moved = plan_ports(1000, apiserver_port=7000)
    assert moved["discovery"] == 9081
    assert moved["webhook"] == 9443
    assert moved["apiserver"] == 7000


def test_an_offset_past_the_last_port_is_refused_in_one_line(tmp_path: Path) -> None:
    code, output = up("--port-offset", "60000", "--work-dir", str(tmp_path))
    assert code == 2
    assert "outside 1..65535" in flat(output)
    assert "Traceback" not in output
    assert len(output.strip().splitlines()) == 1


def test_a_port_in_use_is_named_with_its_owner_and_a_free_offset(
    listening: int, tmp_path: Path
) -> None:
    offset = free_offset(start=20_000)
    assert offset is not None
    args = ("--apiserver-port", str(listening), "--port-offset", str(offset))
    code, output = up(*args, "--work-dir", str(tmp_path))
    assert code == 2
    assert f"port {listening} (apiserver) already in use" in flat(output)
    assert "--port-offset" in output
    assert "Traceback" not in output


def test_an_apiserver_port_out_of_range_is_a_usage_error_not_a_traceback(
    tmp_path: Path,
) -> None:
    code, output = up("--apiserver-port", "99999", "--work-dir", str(tmp_path))
    assert code == 2
    assert "Invalid value for '--apiserver-port'" in flat(output)
    assert "65535" in output
    assert "Traceback" not in output


def test_a_second_stack_in_a_work_dir_in_use_is_refused(
    rgpu_lookalike: int, tmp_path: Path
) -> None:
    (tmp_path / "pid").write_text(f"{rgpu_lookalike}\n")
    offset = free_offset(start=30_000)
    code, output = up("--port-offset", str(offset), "--work-dir", str(tmp_path))
    assert code == 2
    assert f"already running from {tmp_path} (pid {rgpu_lookalike})" in flat(output)
    assert "rgpu down" in output


def test_a_stale_pid_file_does_not_block_the_work_dir(tmp_path: Path) -> None:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (tmp_path / "pid").write_text(finished.stdout)
    assert StackDir(tmp_path).running() is None


def test_env_without_a_stack_says_how_to_start_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["env", "--work-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no stack is running" in flat(result.output)
    assert f"rgpu up --sim --work-dir {tmp_path}" in flat(result.output)


def test_down_without_a_stack_has_nothing_to_stop(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["down", "--work-dir", str(tmp_path)])
    assert result.exit_code == 0
    assert "nothing to stop" in result.output


def test_a_published_stack_gives_a_kubeconfig_and_its_exports(
    rgpu_lookalike: int, tmp_path: Path
) -> None:
    where = StackDir(tmp_path)
    where.claim()
    where.publish("http://127.0.0.1:6443", {"KUBECONFIG": str(where.kubeconfig)})
    config = yaml.safe_load(where.kubeconfig.read_text())
    assert config["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:6443"
    assert config["current-context"] == "rgpu-sim"
    # The stack is whoever the pid file names, as long as it runs.
    where.pid_file.write_text(f"{rgpu_lookalike}\n")
    result = CliRunner().invoke(app, ["env", "--work-dir", str(tmp_path)])
    assert result.exit_code == 0
    assert result.output == f"export KUBECONFIG={where.kubeconfig}\n"
    where.release()
    assert not where.env_file.exists()
    assert where.kubeconfig.exists()
