"""What a soak prints: the summary of what it measured and its PASS/FAIL lines."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from .checks import CheckResult
from .verdict import percentile

__all__ = ["SoakReport", "print_soak_report"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakReport:
    """What the soak measured, and its verdict."""

    pods: int
    wall_seconds: float
    bound: int
    succeeded: int
    deleted: int
    waits: tuple[float, ...]
    faults: dict[str, int]
    checks: tuple[CheckResult, ...]
    preemption: str = ""
    """The priority mix's figures (empty without it)."""
    scheduler: str = ""
    """The scheduler emulator's waits (each extender verb, each scheduling cycle): a parked
    pod's wake-up queues behind the cycles of every pod ahead of it."""
    cycles: str = ""
    """Scheduler cycles per bound GPU pod."""
    queues: str = ""
    """The queue workload's quotas and weights (empty without it)."""

    @property
    def ok(self) -> bool:
        return all(check.passed for check in self.checks)


def print_soak_report(report: SoakReport, console: Console) -> None:
    """The summary and the PASS/FAIL lines."""
    table = Table(title="rgpu soak summary", show_header=False)
    table.add_row(
        "pods",
        f"{report.pods} planned, {report.bound} bound, {report.succeeded} succeeded, "
        f"{report.deleted} deleted by the workload",
    )
    table.add_row("wall time", f"{report.wall_seconds:.1f}s")
    table.add_row(
        "wake-up (capacity freed → bound)",
        f"p50 {percentile(report.waits, 50):.2f}s, p99 {percentile(report.waits, 99):.2f}s "
        f"({len(report.waits)} parked pods)",
    )
    if report.preemption:
        table.add_row("preemption", report.preemption)
    if report.scheduler:
        table.add_row("scheduler (ms p50/p99)", report.scheduler)
    if report.cycles:
        table.add_row("scheduler cycles", report.cycles)
    if report.queues:
        table.add_row("queues", report.queues)
    table.add_row(
        "faults injected", ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items())) or "none"
    )
    console.print(table)
    for check in report.checks:
        mark = "[green]PASS[/]" if check.passed else "[red]FAIL[/]"
        detail = f" — {check.detail}" if check.detail and not check.passed else ""
        console.print(f"{mark} {check.name}{detail}", soft_wrap=True, highlight=False)
