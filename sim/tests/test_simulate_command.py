"""``rgpu simulate`` as the command runs it: the shipped example in both granularities, and a
bad spec refused with exit 2."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from rgpu_cli.main import app

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mixed-workload.yaml"


def test_simulate_prints_both_granularities_for_the_example(tmp_path: Path) -> None:
    spec = tmp_path / "small.yaml"
    spec.write_text(EXAMPLE.read_text().replace("pods: 400", "pods: 30"))
    result = CliRunner().invoke(app, ["simulate", str(spec)])
    assert result.exit_code == 0, result.output
    assert "granularity server" in result.output
    assert "granularity card" in result.output


def test_simulate_rejects_a_bad_spec_with_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("fleet: {servers: -1}\n")
    result = CliRunner().invoke(app, ["simulate", str(spec)])
    assert result.exit_code == 2
    assert "servers" in result.output
