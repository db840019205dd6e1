"""The ``rgpu status`` command: options, filters and output shapes; the reading and drawing
live in ``status``."""

from __future__ import annotations

import json
import os
import sys

import anyio
import typer
from rich.console import Console
from rich.markup import escape

from .status import (
    STATES,
    Filters,
    SourceError,
    card_rows,
    fetch_snapshot,
    render_json,
    render_servers,
    render_wide,
    summary,
)

__all__ = ["status"]

OUTPUTS = ("table", "wide", "json")


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def _output(value: str) -> str:
    if value not in OUTPUTS:
        raise typer.BadParameter(f"must be one of {', '.join(OUTPUTS)}")
    return value


def _states(values: list[str]) -> list[str]:
    unknown = sorted(set(values) - set(STATES))
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: expected one of {', '.join(STATES)}")
    return values


def status(
    output: str = typer.Option(
        "table", "--output", "-o", callback=_output, help="table (per server) | wide | json"
    ),
    server: list[str] = typer.Option([], "--server", help="only this server (repeatable)"),
    state: list[str] = typer.Option(
        [],
        "--state",
        callback=_states,
        help="only cards in this state (repeatable; held = booked, committed or bound)",
    ),
    holder: str = typer.Option("", "--holder", help="only cards held by NAMESPACE/POD"),
    discovery_url: str = typer.Option(
        lambda: _env("RGPU_DISCOVERY_URL", "http://127.0.0.1:8081"),
        help="discovery base URL (RGPU_DISCOVERY_URL)",
    ),
    allocator_url: str = typer.Option(
        lambda: _env("RGPU_ALLOCATOR_URL", "http://127.0.0.1:8082"),
        help="allocator base URL (RGPU_ALLOCATOR_URL)",
    ),
) -> None:
    """Servers, cards, states and holders (from discovery and the allocator)."""
    try:
        snapshot = anyio.run(fetch_snapshot, discovery_url, allocator_url)
    except SourceError as exc:
        message = f"[red]rgpu status:[/] {escape(str(exc))}"
        Console(stderr=True).print(message, soft_wrap=True, highlight=False)
        raise typer.Exit(code=2) from None
    filters = Filters(servers=frozenset(server), states=frozenset(state), holder=holder)
    rows = [row for row in card_rows(snapshot) if filters.keep(row)]
    if output == "json":
        sys.stdout.write(json.dumps(render_json(snapshot, rows), indent=2) + "\n")
        return
    print(summary(snapshot, rows))
    if rows:
        print(render_wide(rows) if output == "wide" else render_servers(rows))
