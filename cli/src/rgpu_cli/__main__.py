"""``python -m rgpu_cli`` is the ``rgpu`` command."""

from __future__ import annotations

from .main import main

main()
