from __future__ import annotations

from rich.console import Console

from rgpu_sim.checks import CheckResult
from rgpu_sim.demo import DemoReport, print_report


def _report(servers: int) -> DemoReport:
    return DemoReport(
        pods=60,
        succeeded=60,
        failed=0,
        bound=60,
        waits=(0.1, 0.2, 0.4),
        utilisation={f"gpu-{i:03d}": (i % 7) / 10 for i in range(servers)},
        refusals={"NodeInsufficientDevice": 3},
        checks=(CheckResult(name="every pod ran to completion", passed=True),),
        wall_seconds=42.0,
    )


def _printed(report: DemoReport) -> str:
    console = Console(record=True, width=160)
    print_report(report, console)
    return console.export_text()


def test_the_summary_of_a_200_server_demo_fits_on_a_screen() -> None:
    text = _printed(_report(200))
    assert len(text.splitlines()) < 30
    assert "200 servers" in text
    assert "max 60.0 %" in text
    assert "PASS every pod ran to completion" in text


def test_the_summary_of_a_small_demo_lists_each_server() -> None:
    text = _printed(_report(6))
    assert [line for line in text.splitlines() if "gpu-0" in line][5].count("gpu-005") == 1
    assert "50.0 %" in text
