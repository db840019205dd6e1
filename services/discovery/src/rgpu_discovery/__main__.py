"""``python -m rgpu_discovery`` runs the service under uvicorn."""

from __future__ import annotations

import logging

from rgpu_runtime.serving import run_service

from .app import create_app
from .settings import DiscoverySettings


def main() -> None:
    """Read the settings, serve discovery until SIGTERM, exit with the service's status."""
    # httpx logs every request at INFO; the probe loop makes one per server per interval,
    # which would bury everything else. Probe outcomes are in the metrics and in our own logs.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    raise SystemExit(run_service("discovery", create_app, settings=DiscoverySettings))


if __name__ == "__main__":
    main()
