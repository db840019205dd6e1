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
    """From the command's start to the verdict: start-up, workload, drain and checks."""
    bound: int
    succeeded: int
    deleted: int
    waits: tuple[float, ...]
    faults: dict[str, int]
    checks: tuple[CheckResult, ...]
    phases: tuple[tuple[str, float], ...] = ()
    """Where ``wall_seconds`` went, phase by phase."""
    woken: str = "parked pods bound"
    """Whose waits ``waits`` holds: on the gate path gated pods admitted and bound once
    capacity freed, on the filter path pods the scheduler refused and bound later."""
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
    phases = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in report.phases)
    table.add_row("wall time", f"{report.wall_seconds:.1f}s" + (f" ({phases})" if phases else ""))
    table.add_row("wake-up (capacity freed → bound)", _wake_ups(report))
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


def _wake_ups(report: SoakReport) -> str:
    """The wake-up figures, or that there were none to take (a stream the fleet kept up
    with leaves no pod waiting for capacity: no figure is better than a NaN)."""
    if not report.waits:
        return f"none: no pod waited for capacity to free (0 {report.woken})"
    return (
        f"p50 {percentile(report.waits, 50):.2f}s, p99 {percentile(report.waits, 99):.2f}s "
        f"({len(report.waits)} {report.woken})"
    )
