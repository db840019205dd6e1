"""The proving ground (``demo``, ``up --sim``, ``soak``, ``simulate``, ``trace``) is a package of
its own, rgpu-sim, so that installing the operator's ``rgpu`` does not install the simulator
and the four services it starts. When rgpu-sim is installed it offers its commands through the
``rgpu.commands`` entry-point group and they join ``rgpu`` here. When it is not, each of its
commands is still a name ``rgpu`` knows, and answers with one line saying what to install
(exit 2) instead of click's "No such command"."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final

import typer

__all__ = ["GROUP", "PROVING_GROUND", "add_commands", "offered"]

GROUP: Final = "rgpu.commands"
"""The entry-point group a package names its ``rgpu`` commands in (name = the command)."""

PROVING_GROUND: Final = ("demo", "up", "env", "down", "soak", "simulate", "trace")
"""The commands rgpu-sim offers, in the order ``rgpu --help`` lists them."""

INSTALL: Final = (
    "install rgpu-sim (in a clone of rgpu: `make setup`, or `uv sync --package rgpu-sim`)"
)

HINTS: Final = {"up": "; on a real cluster rgpu runs from k8s/ (see the README), not `rgpu up`"}
"""What a command's absence means besides the install line, where it means more."""

_ANY_ARGUMENTS: Final = {"allow_extra_args": True, "ignore_unknown_options": True}


def offered() -> tuple[EntryPoint, ...]:
    """The commands installed packages offer to ``rgpu``."""
    return tuple(entry_points(group=GROUP))


def add_commands(app: typer.Typer, found: Iterable[EntryPoint]) -> None:
    """Add each offered command to ``app``, and a one-line refusal for each proving-ground
    command nothing offers. A command ``app`` already has is never replaced."""
    taken = {_name(info.name, info.callback) for info in app.registered_commands}
    points = [point for point in found if point.name not in taken]
    names = {point.name for point in points}
    for point in sorted(points, key=lambda p: _rank(p.name)):
        _add(app, point)
    for name in PROVING_GROUND:
        if name not in names and name not in taken:
            hint = HINTS.get(name, "")
            _refuse(app, name, f"the proving ground is not installed: {INSTALL}{hint}")


def _add(app: typer.Typer, point: EntryPoint) -> None:
    try:
        command = point.load()
    except Exception as exc:  # whatever a broken install raises, `rgpu status` must still run
        reason = f"the proving ground is installed but does not load ({type(exc).__name__}: {exc})"
        _refuse(app, point.name, f"{reason}; reinstall it: {INSTALL}")
        return
    app.command(point.name)(command)


def _refuse(app: typer.Typer, name: str, reason: str) -> None:
    def refuse() -> None:
        typer.echo(f"rgpu {name}: {reason}", err=True)
        raise typer.Exit(code=2)

    help_text = f"Not installed: part of the proving ground (rgpu-sim). `rgpu {name}` says more."
    app.command(name, help=help_text, context_settings=_ANY_ARGUMENTS, add_help_option=False)(
        refuse
    )


def _rank(name: str) -> tuple[int, str]:
    known = name in PROVING_GROUND
    return (PROVING_GROUND.index(name) if known else len(PROVING_GROUND), name)


def _name(given: str | None, callback: Callable[..., Any] | None) -> str:
    # typer's own rule for a command registered without a name: the function's, dashed.
    if given:
        return given
    return "" if callback is None else callback.__name__.lower().replace("_", "-")
