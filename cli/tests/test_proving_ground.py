"""``rgpu`` without the proving ground: its commands (``demo``, ``up``, ``soak``, ...) are names
the operator's command knows and refuses in one line that says what to install, exit 2; an
installed package offers commands by entry point but never replaces an operator's command."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
from typer.testing import CliRunner

from rgpu_cli.main import create_app
from rgpu_cli.proving_ground import GROUP, PROVING_GROUND


def point(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=GROUP)


@pytest.mark.parametrize("args", [[name] for name in PROVING_GROUND] + [["up", "--sim", "-d"]])
def test_without_the_proving_ground_its_commands_say_what_to_install_in_one_line(
    args: list[str],
) -> None:
    result = CliRunner().invoke(create_app(()), [*args, "--help"])

    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"rgpu {args[0]}: the proving ground is not installed")
    assert "rgpu-sim" in line and "make setup" in line
    assert "Traceback" not in result.output


def test_without_the_proving_ground_up_also_says_where_a_real_cluster_runs_rgpu() -> None:
    result = CliRunner().invoke(create_app(()), ["up"])

    assert result.exit_code == 2
    assert "k8s/" in result.output


def test_without_the_proving_ground_help_lists_its_commands_as_not_installed() -> None:
    result = CliRunner().invoke(create_app(()), ["--help"], env={"COLUMNS": "200"})

    assert result.exit_code == 0
    for name in ("status", "explain", "queue", "cordon", "drain", "usage", *PROVING_GROUND):
        assert f" {name} " in result.output
    assert result.output.count("Not installed") == len(PROVING_GROUND)


def test_an_offered_command_joins_rgpu_under_its_entry_point_name() -> None:
    app = create_app((point("hello", "rgpu_cli.columns:columns"),))
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})

    assert " hello " in result.output


def test_an_offered_command_never_replaces_an_operators_command() -> None:
    app = create_app((point("status", "rgpu_cli.no_such_module:status"),))
    result = CliRunner().invoke(app, ["status", "--help"], env={"COLUMNS": "200"})

    assert result.exit_code == 0
    assert "--discovery-url" in result.output


def test_a_proving_ground_that_does_not_load_is_said_in_one_line_and_the_rest_still_runs() -> None:
    app = create_app((point("demo", "rgpu_sim_broken_install:demo"),))
    demo = CliRunner().invoke(app, ["demo"])
    status = CliRunner().invoke(app, ["status", "--help"])

    assert demo.exit_code == 2
    (line,) = demo.output.strip().splitlines()
    assert "installed but does not load (ModuleNotFoundError" in line
    assert "reinstall" in line
    assert status.exit_code == 0
