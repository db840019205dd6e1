"""``make demo`` is the project's main job on a fresh machine — the
whole system scheduling a real workload on the embedded cluster, then an independent verdict."""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import anyio
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rgpu_contracts import Reason
from rgpu_kubesim.fleet import PodPlan, WorkloadSpec, plan_workload

from .checks import CheckResult, check_endpoints, check_no_sharing
from .stack import Stack, StackOptions, run_stack
from .stack_rbac import check_authorized
from .steps import PIPED_EVERY, Steps
from .timeline import Hold, Panel
from .utilisation import Held, utilisation, utilisation_table

__all__ = ["DemoOptions", "DemoReport", "run_demo"]

_REASON = re.compile(r"\d+/\d+ (" + "|".join(r.value for r in Reason) + r")\b")


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    """``rgpu demo``'s knobs; the defaults are ``make demo``'s."""

    stack: StackOptions = field(default_factory=StackOptions)
    pods: int = 60
    run_seconds: tuple[float, float] = (1.0, 4.0)
    mean_gap_seconds: float = 0.15
    timeout_seconds: float = 100.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoReport:
    """What the demo measured and whether every check passed."""

    pods: int
    succeeded: int
    failed: int
    bound: int
    waits: tuple[float, ...]
    utilisation: dict[str, float]
    refusals: dict[str, int]
    checks: tuple[CheckResult, ...]
    wall_seconds: float
    """From the first pod's submission until the last finished (the stack's start and stop
    are not in it)."""
    timeline: Panel | None = None
    """Who held which server when, as the kubelet saw it (for ``--timeline``)."""
    slowest: str = ""
    """``namespace/name`` of the pod that waited longest to bind (the one worth tracing)."""

    @property
    def ok(self) -> bool:
        return all(check.passed for check in self.checks)


def _workload(options: DemoOptions) -> tuple[PodPlan, ...]:
    spec = WorkloadSpec(
        pods=options.pods,
        seed=options.stack.seed,
        max_cards=min(2, options.stack.cards),
        mean_gap_seconds=options.mean_gap_seconds,
        run_seconds=options.run_seconds,
        memory_mib_choices=(8192, 16384),
    )
    return plan_workload(spec)


async def _submit(stack: Stack, plans: tuple[PodPlan, ...], errors: list[str]) -> None:
    start = time.monotonic()
    for plan in plans:
        await anyio.sleep(max(0.0, start + plan.arrival_seconds - time.monotonic()))
        response = await stack.create_pod(plan.manifest())
        if response.status_code != 201:
            errors.append(
                f"{plan.namespace}/{plan.name}: {response.status_code} {response.text[:200]}"
            )


def _finished(stack: Stack) -> int:
    return sum(1 for r in stack.kubelet.records.values() if r.phase in ("Succeeded", "Failed"))


def _bound(stack: Stack) -> int:
    return sum(1 for r in stack.scheduler.records.values() if r.bound_at)


async def _watch_progress(stack: Stack, total: int, console: Console, timeout: float) -> None:
    if not console.is_terminal:  # no live bars in a log: a line every so often instead
        await _print_progress(stack, total, console, timeout)
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
    )
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as progress:
        bound = progress.add_task("bound   ", total=total)
        done = progress.add_task("finished", total=total)
        with anyio.move_on_after(timeout):
            while _finished(stack) < total:
                progress.update(bound, completed=_bound(stack))
                progress.update(done, completed=_finished(stack))
                await anyio.sleep(0.2)
        progress.update(bound, completed=_bound(stack))
        progress.update(done, completed=_finished(stack))


async def _print_progress(stack: Stack, total: int, console: Console, timeout: float) -> None:
    started = last = time.monotonic()
    with anyio.move_on_after(timeout):
        while _finished(stack) < total:
            await anyio.sleep(0.2)
            if time.monotonic() - last >= PIPED_EVERY:
                last = time.monotonic()
                console.print(
                    f"workload: {_bound(stack)}/{total} bound, {_finished(stack)}/{total} "
                    f"finished ({last - started:.0f}s)"
                )
    console.print(f"workload: {_bound(stack)}/{total} bound, {_finished(stack)}/{total} finished")


def _utilisation(stack: Stack, started: float, now: float) -> dict[str, float]:
    endpoints = stack.fleet.endpoints()
    names = {endpoint: name for name, endpoint in endpoints.items()}
    holds = (
        Held(server=names[record.endpoint], start=record.started_at, end=record.finished_at)
        for record in stack.kubelet.records.values()
        if record.gpus and record.endpoint in names
    )
    return utilisation(holds, endpoints, started, now)


def _timeline(stack: Stack, started: float, now: float) -> Panel:
    """The kubelet's record of each pod's run, as holds of cards from the workload's start."""
    names = {server.endpoint: server.name for server in stack.fleet.lupine}
    indices = {gpu.uuid: gpu.index for server in stack.fleet.lupine for gpu in server.gpus}
    holds = tuple(
        Hold(
            server=names[record.endpoint],
            pod=record.key,
            start=record.started_at - started,
            end=(record.finished_at or now) - started,
            first=min(indices.get(uuid, 0) for uuid in record.gpus),
            cards=len(record.gpus),
        )
        for record in stack.kubelet.records.values()
        if record.gpus and record.endpoint in names
    )
    servers = tuple((server.name, len(server.gpus)) for server in stack.fleet.lupine)
    s = stack.options
    title = f"granularity {s.granularity}: {s.servers} servers x {s.cards} cards, seed {s.seed}"
    return Panel(title=title, servers=servers, holds=holds, span=now - started)


def _refusals(stack: Stack) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for record in stack.scheduler.records.values():
        for message in record.refusals:
            counts.update(set(_REASON.findall(message)) or {"other"})
    return dict(counts.most_common())


def _report(
    stack: Stack, plans: tuple[PodPlan, ...], errors: list[str], started: float
) -> DemoReport:
    now = time.monotonic()
    records = list(stack.kubelet.records.values())
    per_card = stack.options.granularity == "card"
    checks = (
        CheckResult(
            name="every pod was admitted by the webhook",
            passed=not errors,
            detail="; ".join(errors[:3]),
        ),
        CheckResult(
            name="every pod ran to completion",
            passed=sum(r.phase == "Succeeded" for r in records) == len(plans),
            detail=f"{sum(r.phase == 'Succeeded' for r in records)}/{len(plans)} succeeded; "
            + "; ".join(f"{r.key}: {r.message}" for r in records if r.phase == "Failed")[:300],
        ),
        check_no_sharing(records, now, per_card=per_card),
        check_endpoints(records, stack.fleet.endpoints()),
        check_authorized(stack.sim),
    )
    waits = tuple(
        r.wait_seconds for r in stack.scheduler.records.values() if r.wait_seconds is not None
    )
    bound = [r for r in stack.scheduler.records.values() if r.wait_seconds is not None]
    slowest = max(bound, key=lambda r: r.wait_seconds or 0.0).key if bound else ""
    return DemoReport(
        slowest=slowest,
        pods=len(plans),
        succeeded=sum(r.phase == "Succeeded" for r in records),
        failed=sum(r.phase == "Failed" for r in records),
        bound=len(waits),
        waits=waits,
        utilisation=_utilisation(stack, started, now),
        refusals=_refusals(stack),
        checks=checks,
        wall_seconds=now - started,
        timeline=_timeline(stack, started, now),
    )


async def run_demo(options: DemoOptions, console: Console) -> DemoReport:
    """Start everything, run the workload with a live progress bar, check, and clean up."""
    plans = _workload(options)
    s = options.stack
    console.print(
        f"[bold]rgpu demo[/]: {s.servers} servers x {s.cards} cards, {s.clients} client nodes, "
        f"{len(plans)} pods, granularity [cyan]{s.granularity}[/], seed {s.seed}"
    )
    with Steps(console) as steps:
        async with run_stack(options.stack, progress=steps) as stack:
            steps.pause()  # the workload's own progress bars take the terminal
            report = await _run_workload(stack, plans, options, console)
            steps("stopping every process")
    return report


async def _run_workload(
    stack: Stack, plans: tuple[PodPlan, ...], options: DemoOptions, console: Console
) -> DemoReport:
    console.print(
        f"stack ready: apiserver {stack.sim.url}; services "
        + ", ".join(f"{name} {proc.url}" for name, proc in stack.services.items()),
        soft_wrap=True,
        highlight=False,
    )
    errors: list[str] = []
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_submit, stack, plans, errors)
        await _watch_progress(stack, len(plans), console, options.timeout_seconds)
        tg.cancel_scope.cancel()
    return _report(stack, plans, errors, started)


def _percentile(values: tuple[float, ...], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def print_report(report: DemoReport, console: Console) -> None:
    """The readable summary ``make demo`` ends with."""
    summary = Table(title="rgpu demo summary", show_header=False)
    summary.add_row(
        "pods",
        f"{report.pods} submitted, {report.bound} bound, "
        f"{report.succeeded} succeeded, {report.failed} failed",
    )
    summary.add_row(
        "wait (creation → bound)",
        f"p50 {_percentile(report.waits, 50):.2f}s, p95 {_percentile(report.waits, 95):.2f}s",
    )
    summary.add_row("workload (first pod → last finished)", f"{report.wall_seconds:.1f}s")
    summary.add_row(
        "refusals by reason", ", ".join(f"{k} {v}" for k, v in report.refusals.items()) or "none"
    )
    console.print(summary)
    console.print(utilisation_table(report.utilisation))
    for check in report.checks:
        mark = "[green]PASS[/]" if check.passed else "[red]FAIL[/]"
        console.print(
            f"{mark} {check.name}"
            + (f" — {check.detail}" if check.detail and not check.passed else "")
        )
