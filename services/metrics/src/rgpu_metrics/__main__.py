"""``python -m rgpu_metrics`` runs the service for real (uvicorn)."""

from __future__ import annotations

from .app import main

if __name__ == "__main__":
    main()
