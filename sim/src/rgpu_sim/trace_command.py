"""The ``rgpu trace`` command: which span file, how deep; the reading and drawing are
``trace.trace_pod``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from .trace import SPANS_VARIABLE, trace_pod

__all__ = ["trace_command"]


def trace_command(
    pod: str = typer.Argument(..., help="NAMESPACE/NAME of the pod"),
    spans_file: Path | None = typer.Option(
        None,
        "--file",
        envvar=SPANS_VARIABLE,
        help="the spans a stack kept (rgpu up --sim prints it)",
        show_default=False,
    ),
    depth: int = typer.Option(0, min=0, help="span levels to draw; 1 shows only the steps"),
) -> None:
    """A pod's scheduling as a waterfall: every step's spans, the slowest step marked."""
    status = trace_pod(pod, spans_file, depth, Console(), Console(stderr=True))
    raise typer.Exit(code=status)
