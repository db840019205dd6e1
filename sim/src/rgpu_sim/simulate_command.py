"""The ``rgpu simulate`` command: the spec read, shapes no layout could ever fit refused (their
figures would be meaningless: a shape that never runs never waits either), the three layouts
(server granularity, card granularity, one lupine per GPU) side by side in columns that cut
nothing, what a layout can never place named under them, and the timeline drawn when asked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from rgpu_cli.columns import columns
from rgpu_placement import Granularity, NeverFits

from .simulate import (
    PodShape,
    SimResult,
    SimSpec,
    SpecError,
    load_spec,
    never_fitting,
    simulate,
)
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


LAYOUTS: tuple[tuple[Granularity, bool], ...] = (
    ("server", False),
    ("card", False),
    ("server", True),
)
"""(granularity, one lupine per GPU) of each layout compared."""


def _shape(shape: PodShape) -> str:
    memory = f", {shape.memory_mib} MiB each" if shape.memory_mib else ""
    return f"shape cards {list(shape.cards)}{memory}"


def _never(spec: SimSpec) -> dict[str, list[tuple[PodShape, NeverFits]]]:
    """Layout label → the shapes it can never place."""
    return {
        SimResult(granularity=g, per_gpu=per_gpu).label: never_fitting(spec, g, per_gpu=per_gpu)
        for g, per_gpu in LAYOUTS
    }


def _refuse_never_fitting(
    never: dict[str, list[tuple[PodShape, NeverFits]]], console: Console
) -> None:
    """Shapes no layout can take: one line each, then exit 1 without figures."""
    everywhere = [
        (shape, found)
        for shape, found in next(iter(never.values()))
        if all(any(s == shape for s, _ in shapes) for shapes in never.values())
    ]
    for shape, found in everywhere:
        console.print(
            f"[red]{escape(_shape(shape))}[/] fits no layout: {escape(found.line)}",
            soft_wrap=True,
            highlight=False,
        )
    if everywhere:
        raise typer.Exit(code=1)


def _notes(never: dict[str, list[tuple[PodShape, NeverFits]]]) -> list[str]:
    """What a layout can never place though another can (a 2-card pod on 1-card instances)."""
    return [
        f"{label}: {_shape(shape)} is never placed ({found.nofit.message})"
        for label, shapes in never.items()
        for shape, found in shapes
    ]


def _panel(spec: SimSpec, result: SimResult) -> Panel:
    servers = tuple((f"gpu-{i + 1:03d}", spec.cards) for i in range(spec.servers))
    return Panel(
        title=f"{result.label}: {result.held_share():.0%} of the cards held",
        servers=servers,
        holds=tuple(result.holds),
        span=max((h.end for h in result.holds), default=result.makespan),
    )


def _namespace_rows(spec: SimSpec, results: list[SimResult]) -> list[tuple[str, ...]]:
    """With namespaces or queues: each namespace's waits and the most cards it held at once."""
    if len(spec.namespaces) < 2 and not spec.queues.namespaces and not spec.queues.default.cards:
        return []
    rows = []
    for namespace, _ in spec.namespaces:
        quota = spec.queues.quota(namespace)
        limit = "no quota" if quota.cards is None else f"quota {quota.cards}"
        label = f"{namespace} ({limit}, weight {quota.weight}): wait p50/p95, most held"
        rows.append((label, *(_namespace_cell(r, namespace) for r in results)))
    return rows


def _namespace_cell(result: SimResult, namespace: str) -> str:
    return (
        f"{result.wait(50, namespace):.0f}s / {result.wait(95, namespace):.0f}s, "
        f"{result.most_held.get(namespace, 0)}"
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
    never = _never(parsed)
    _refuse_never_fitting(never, console)
    results = [simulate(parsed, g, per_gpu=per_gpu) for g, per_gpu in LAYOUTS]
    print(f"{parsed.pods} pods on {parsed.servers} servers x {parsed.cards} cards")
    headers = ("", *(r.label for r in results))
    rows = [(label, *(cell(r) for r in results)) for label, cell in ROWS.items()]
    print(columns(headers, [*rows, *_namespace_rows(parsed, results)]))
    for result in results:
        refusals = ", ".join(f"{k} {v}" for k, v in result.refusal_counts()) or "none"
        print(f"pods refused at least once ({result.label}): {refusals}")
    for note in _notes(never):
        print(note)
    if timeline is not None:
        title = f"rgpu simulate {spec.name}: {parsed.pods} pods on {parsed.servers} servers"
        svg = timeline_svg([_panel(parsed, r) for r in results], title=title)
        timeline.write_text(svg)
        print(f"timeline: {timeline}")
