"""The commands an operator runs on the pool — ``cordon``, ``uncordon``, ``drain`` and
``usage`` — as typer functions: arguments, printing and exit codes only; the work is in
``cordon``, ``drain`` and ``usage``. ``main`` registers them.

Like ``rgpu explain`` they read ``RGPU_KUBE_URL`` (else in-cluster, else ``KUBECONFIG``),
``RGPU_NAMESPACE`` and ``RGPU_ALLOCATOR_URL`` from the environment, as the services do.
"""

from __future__ import annotations

import os

import anyio
import httpx
import typer
from rich.console import Console
from rich.table import Table

from rgpu_contracts import ClaimSet, ContractError
from rgpu_runtime.errors import RgpuError
from rgpu_runtime.settings import Settings

from .cordon import cordon
from .drain import drain
from .usage import SpanError, Usage, from_claims, from_prometheus, parse_since

__all__ = ["cordon_command", "drain_command", "uncordon_command", "usage_command"]

_SERVER = typer.Argument(..., help="a server as `rgpu status` names it: NODE or NODE@PORT")
_CARDS = typer.Option(None, "--card", help="only this GPU UUID (repeat for more)")


def _settings(console: Console) -> Settings:
    try:
        return Settings.from_env(os.environ, service="extender")
    except RgpuError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(code=2) from None


def _switch(server: str, cards: list[str] | None, *, on: bool) -> None:
    console = Console()
    settings = _settings(console)
    try:
        done = anyio.run(lambda: cordon(settings, server, cards=cards or (), on=on))
    except RgpuError as exc:
        console.print(f"[red]cannot {'cordon' if on else 'uncordon'} {server}:[/] {exc}")
        raise typer.Exit(code=2) from None
    console.print(done.describe(server, on=on), highlight=False)


def cordon_command(server: str = _SERVER, card: list[str] | None = _CARDS) -> None:
    """Stop new bookings on a server (its Node's spec.unschedulable) or on some of its cards
    (hami.io/device-cordon); holders stay."""
    _switch(server, card, on=True)


def uncordon_command(server: str = _SERVER, card: list[str] | None = _CARDS) -> None:
    """Let a cordoned server (or cards) be booked again."""
    _switch(server, card, on=False)


def drain_command(
    server: str = _SERVER,
    timeout: float = typer.Option(300.0, min=1.0, help="seconds to wait for the holders"),
) -> None:
    """Cordon a server, evict its holders (disruption budgets respected) and wait until they
    are gone. Exit code 0 drained, 1 holders left at the timeout, 2 could not start."""
    console = Console()
    settings = _settings(console)

    def say(line: str) -> None:
        console.print(f"  {line}", highlight=False)

    try:
        report = anyio.run(lambda: drain(settings, server, timeout=timeout, say=say))
    except RgpuError as exc:
        console.print(f"[red]cannot drain {server}:[/] {exc}")
        raise typer.Exit(code=2) from None
    if report.finished:
        console.print(f"[green]{server} drained[/]: {len(report.holders)} holder(s) moved")
        return
    left = ", ".join(p.key for p in report.left)
    console.print(f"[red]{server} not drained after {timeout:g}s[/]: still held by {left}")
    raise typer.Exit(code=1)


def usage_command(
    since: str = typer.Option("24h", help="window: 30m, 24h, 7d, ..."),
    prometheus: str | None = typer.Option(
        None, help="Prometheus base URL; without it, the claims held now"
    ),
    allocator_url: str = typer.Option(
        lambda: os.environ.get("RGPU_ALLOCATOR_URL") or "http://127.0.0.1:8082",
        help="allocator base URL (without --prometheus)",
    ),
) -> None:
    """Card-hours per namespace: from Prometheus, or from the claims held now."""
    console = Console()
    try:
        _, seconds = parse_since(since)
        usage = anyio.run(lambda: _usage(since, seconds, prometheus, allocator_url))
    except SpanError as exc:
        raise typer.BadParameter(str(exc)) from None
    except (httpx.HTTPError, ValueError, ContractError) as exc:
        console.print(f"[red]cannot read the usage:[/] {exc}")
        raise typer.Exit(code=2) from None
    console.print(_table(usage, since))


async def _usage(since: str, seconds: float, prometheus: str | None, allocator_url: str) -> Usage:
    if prometheus is not None:
        return await from_prometheus(prometheus, since)
    async with httpx.AsyncClient(base_url=allocator_url, timeout=10) as client:
        answer = await client.get("/v1/claims")
        answer.raise_for_status()
    return from_claims(ClaimSet.from_dict(answer.json()), seconds)


def _table(usage: Usage, since: str) -> Table:
    table = Table(title=f"card-hours by namespace, last {since}", caption=usage.source)
    table.add_column("namespace")
    table.add_column("card-hours", justify="right")
    known = any(row.held_now is not None for row in usage.rows)
    if known:
        table.add_column("cards held now", justify="right")
    for row in usage.rows:
        cells = [row.namespace or "-", f"{row.card_hours:.2f}"]
        if known:
            cells.append(str(row.held_now))
        table.add_row(*cells)
    return table
