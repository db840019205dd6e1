"""Rich draws error boxes and tables as wide as the terminal, so where a sentence breaks
depends on the terminal's width and on how long the paths in it are (a temporary directory is
longer on one machine than on another). A test that looks for a phrase looks in ``flat(text)``.
"""

from __future__ import annotations

import re

__all__ = ["flat"]

_BOX = re.compile(r"[\u2500-\u257f]")
"""Unicode's box-drawing block: the borders of rich's panels and tables."""


def flat(text: str) -> str:
    """``text`` with box borders dropped and every run of whitespace (line breaks included)
    made one space; a word rich broke inside (a long path) is joined again only where the
    break fell on whitespace, which is where rich breaks."""
    return " ".join(_BOX.sub(" ", text).split())
