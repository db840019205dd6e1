"""The proving ground joins the one ``rgpu`` command through its ``rgpu.commands`` entry points:
installed, every one of its commands is offered with its own options, beside the operator's."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from typer.testing import CliRunner

from rgpu_cli.main import app
from rgpu_cli.proving_ground import GROUP, PROVING_GROUND
from rgpu_sim.demo_command import demo
from rgpu_sim.up_command import up


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("demo", "up", "status", "explain", "simulate"):
        assert command in result.output


def test_the_installed_proving_ground_offers_each_of_its_commands_by_entry_point() -> None:
    offered = {point.name: point.load() for point in entry_points(group=GROUP)}

    assert set(offered) == set(PROVING_GROUND)
    assert offered["demo"] is demo
    assert offered["up"] is up


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("demo", "--pods"),
        ("up", "--port-offset"),
        ("env", "--work-dir"),
        ("down", "--work-dir"),
        ("soak", "--wake-limit-seconds"),
        ("simulate", "--timeline"),
        ("trace", "--depth"),
    ],
)
def test_rgpu_runs_each_offered_command_with_its_own_options(command: str, option: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})

    assert result.exit_code == 0, result.output
    assert option in result.output
    assert "not installed" not in result.output


def test_up_without_sim_still_points_at_the_manifests() -> None:
    result = CliRunner().invoke(app, ["up"])

    assert result.exit_code == 2
    assert "only --sim is supported here" in result.output
