"""Why this module exists: ``python -m rgpu_discovery`` runs the service under uvicorn."""

from __future__ import annotations

from rgpu_runtime import run_service

from .app import create_app


def main() -> None:
    """Read the settings, serve discovery until SIGTERM, exit with the service's status."""
    raise SystemExit(run_service("discovery", create_app))


if __name__ == "__main__":
    main()
