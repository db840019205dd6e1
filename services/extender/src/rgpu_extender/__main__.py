"""``python -m rgpu_extender``: serve the extender (and, with a certificate, the webhook)."""

from __future__ import annotations

from .app import main

if __name__ == "__main__":
    main()
