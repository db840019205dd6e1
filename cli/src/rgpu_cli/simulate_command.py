"""The ``rgpu simulate`` command: the spec read, shapes that can never fit refused (their
figures would be meaningless: a shape that never runs never waits either), both granularities
side by side in columns that cut nothing, and the timeline drawn when asked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from .columns import columns
from .simulate import SimResult, SimSpec, SpecError, load_spec, never_fitting, simulate
from .timeline import Panel, timeline_svg

__all__ = ["simulate_command"]

ROWS: dict[str, Callable[[SimResult], str]] = {
    "cards held (share of fleet-time)": lambda r: f"{r.held_share():.0%}",
    "cards asked for (share of fleet-time)": lambda r: f"{r.used_share():.0%}",
    "wait p50": lambda r: f"{r.wait(50):.0f}s",
    "wait p95": lambda r: f"{r.wait(95):.0f}s",
    "makespan": lambda r: f"{r.makespan:.0f}s",
    "pods never placed": lambda r: str(r.never_placed),
}


def _refuse_never_fitting(spec: SimSpec, console: Console) -> None:
    problems = [
        (granularity, shape, never)
        for granularity in ("server", "card")
        for shape, never in never_fitting(spec, granularity)
    ]
    for granularity, shape, never in problems:
        memory = f", {shape.memory_mib} MiB each" if shape.memory_mib else ""
        console.print(
            f"[red]{escape(f'shape cards {list(shape.cards)}{memory}')}[/] "
            f"(granularity {granularity}): {escape(never.line)}",
            soft_wrap=True,
            highlight=False,
        )
    if problems:
        raise typer.Exit(code=1)


def _panel(spec: SimSpec, result: SimResult) -> Panel:
    servers = tuple((f"gpu-{i + 1:03d}", spec.cards) for i in range(spec.servers))
    return Panel(
        title=f"granularity {result.granularity}: {result.held_share():.0%} of the cards held",
        servers=servers,
        holds=tuple(result.holds),
        span=max((h.end for h in result.holds), default=result.makespan),
    )


def simulate_command(
    spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="SPEC.yaml"),
    timeline: Path | None = typer.Option(
        None, help="also draw who held which server when, as an SVG image, to this file"
    ),
) -> None:
    """What-if: replay a described fleet and workload in both granularities, side by side."""
    console = Console()
    try:
        parsed = load_spec(yaml.safe_load(spec.read_text()))
    except (yaml.YAMLError, SpecError) as exc:
        console.print(f"[red]{spec}:[/] {exc}")
        raise typer.Exit(code=2) from None
    _refuse_never_fitting(parsed, console)
    results = [simulate(parsed, "server"), simulate(parsed, "card")]
    print(f"{parsed.pods} pods on {parsed.servers} servers x {parsed.cards} cards")
    headers = ("", *(f"granularity {r.granularity}" for r in results))
    print(columns(headers, [(label, *(cell(r) for r in results)) for label, cell in ROWS.items()]))
    for result in results:
        refusals = ", ".join(f"{k} {v}" for k, v in result.refusal_counts()) or "none"
        print(f"pods refused at least once (granularity {result.granularity}): {refusals}")
    if timeline is not None:
        title = f"rgpu simulate {spec.name}: {parsed.pods} pods on {parsed.servers} servers"
        svg = timeline_svg([_panel(parsed, r) for r in results], title=title)
        timeline.write_text(svg)
        print(f"timeline: {timeline}")
