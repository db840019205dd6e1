from __future__ import annotations

from typer.testing import CliRunner

from rgpu_cli.main import app


def test_status_reports_unreachable_sources_with_exit_2() -> None:
    result = CliRunner().invoke(
        app,
        [
            "status",
            "--discovery-url",
            "http://127.0.0.1:9",
            "--allocator-url",
            "http://127.0.0.1:9",
        ],
    )
    assert result.exit_code == 2
    assert "cannot read" in result.output


def test_explain_needs_namespace_and_name() -> None:
    result = CliRunner().invoke(app, ["explain", "just-a-name"])
    assert result.exit_code == 2
