"""The ``rgpu demo`` command: options, exit codes and what is printed after the run; the run
itself is ``demo.run_demo``."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import anyio
import typer
from rich.console import Console

from .arguments import check_granularity, check_new_file
from .demo import DemoOptions, DemoReport, print_report, run_demo
from .processes import die_with_parent, run_until_stopped
from .stack import StackOptions, loop_options
from .timeline import timeline_svg
from .trace import SPANS_VARIABLE

__all__ = ["demo"]


def demo(
    servers: int = typer.Option(6, min=1, help="lupine servers to simulate"),
    cards: int = typer.Option(4, min=1, help="GPUs per server"),
    clients: int = typer.Option(12, min=1, help="GPU-less client nodes"),
    pods: int = typer.Option(60, min=1, help="pods in the workload"),
    granularity: str = typer.Option("server", callback=check_granularity, help="server | card"),
    seed: int = typer.Option(1, help="seed for the fleet and the workload"),
    work_dir: Path | None = typer.Option(None, help="keep service logs here"),
    timeline: Path | None = typer.Option(
        None,
        callback=check_new_file,
        help="also draw who held which server when, as an SVG image, to this file",
    ),
    otlp_endpoint: str | None = typer.Option(
        None, help="send the services' traces to this OTLP/HTTP URL instead of keeping them"
    ),
) -> None:
    """Run the whole system on the embedded cluster, schedule a workload, check, and clean up."""
    console = Console()
    spans = None if otlp_endpoint else _spans_file(work_dir, "demo")
    stack = StackOptions(
        servers=servers,
        cards=cards,
        clients=clients,
        seed=seed,
        granularity=granularity,
        work_dir=work_dir,
        spans_file=spans,
        otlp_endpoint=otlp_endpoint,
    )
    die_with_parent(signal.SIGTERM)
    report = anyio.run(
        _demo, DemoOptions(stack=stack, pods=pods), console, backend_options=loop_options()
    )
    if report is None:
        console.print("[red]interrupted[/]; every process was stopped")
        raise typer.Exit(code=130)
    print_report(report, console)
    _print_traces(console, spans, otlp_endpoint, report.slowest)
    if timeline is not None and report.timeline is not None:
        title = f"rgpu demo: {pods} pods, as the kubelet ran them"
        timeline.write_text(timeline_svg([report.timeline], title=title))
        console.print(f"timeline: {timeline}", soft_wrap=True, highlight=False)
    raise typer.Exit(code=0 if report.ok else 1)


def _spans_file(work_dir: Path | None, command: str) -> Path:
    """Where a stack keeps its spans: the work dir, or a file of its own that outlives it."""
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        return work_dir / "spans.jsonl"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.gettempdir()) / f"rgpu-{command}-{stamp}-{os.getpid()}-spans.jsonl"


def _print_traces(console: Console, spans: Path | None, endpoint: str | None, pod: str) -> None:
    if spans is None:
        console.print(f"traces were sent to {endpoint}", soft_wrap=True, highlight=False)
        return
    console.print(f"traces kept in {spans}; the pod that waited longest:", highlight=False)
    command = f"{SPANS_VARIABLE}={spans} rgpu trace {pod or 'NAMESPACE/POD'}"
    console.print(command, soft_wrap=True, highlight=False)


async def _demo(options: DemoOptions, console: Console) -> DemoReport | None:
    return await run_until_stopped(lambda: run_demo(options, console))
