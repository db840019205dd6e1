"""Option checks ``demo`` and ``soak`` share: each refuses a bad value before a run that takes
minutes starts."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["check_granularity", "check_new_file"]


def check_granularity(value: str) -> str:
    if value not in ("server", "card"):
        raise typer.BadParameter("must be 'server' or 'card'")
    return value


def check_new_file(value: Path | None) -> Path | None:
    # Checked before the run: a demo or soak takes minutes, and writes this file at the end.
    if value is not None and not value.parent.is_dir():
        raise typer.BadParameter(
            f"{value.parent} is not a directory: create it, or name a file in one that exists"
        )
    return value
