"""``python -m rgpu_allocator`` runs the allocator for real."""

from __future__ import annotations

from rgpu_runtime.serving import run_service

from .app import create_app
from .settings import AllocatorSettings


def main() -> None:
    """Serve the allocator under uvicorn until SIGTERM; exits 2 on a bad setting."""
    raise SystemExit(run_service("allocator", create_app, settings=AllocatorSettings))


if __name__ == "__main__":
    main()
