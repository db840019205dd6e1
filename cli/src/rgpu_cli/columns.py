"""Tables the way kubectl prints them: upper-case headers, columns padded with spaces, no
borders, and no cell ever cut. A rich table squeezed into 80 columns (or piped, where rich
assumes 80) ellipsises holders, endpoints and reason names — the very text an operator copies.
A row wider than the terminal wraps instead, and ``grep``/``awk`` see whole values."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["columns"]

_GAP = "   "


def columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The table as text, one line per row, every cell whole (empty cells show ``-``)."""
    cells = [[h.upper() for h in headers], *([c or "-" for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = (
        _GAP.join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )
    return "\n".join(lines)
