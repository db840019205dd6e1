"""Every service's ``main()`` does the same five things in order.

Read settings (a bad value exits with status 2 and the ``SettingsError`` message, no
traceback), configure logging, set up telemetry, build the app with the service's
``create_app(settings)``, and serve it under uvloop until SIGTERM. A service's entrypoint is
one line::

    def main() -> None:
        raise SystemExit(run_service("allocator", create_app, settings=Settings))
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import anyio
from starlette.types import ASGIApp

from rgpu_runtime.errors import SettingsError
from rgpu_runtime.settings import Settings
from rgpu_runtime.telemetry import configure_logging, instrument_app, setup_telemetry

from ._groups import lone
from ._listeners import Listener, serve_listeners

__all__ = ["default_listeners", "run_service"]

S = TypeVar("S", bound=Settings)

logger = logging.getLogger(__name__)

EXIT_BAD_SETTINGS = 2
EXIT_FAILED = 1

SPAN_FLUSH_SECONDS = 1.0
"""Seconds the last spans get to reach the collector at exit."""


def default_listeners(settings: Settings) -> Sequence[Listener]:
    """Serve on ``RGPU_LISTEN`` only (every service but the extender)."""
    return [Listener(listen=settings.http.listen, limits=settings.http.limits)]


def run_service(
    service: str,
    create_app: Callable[[S], ASGIApp],
    *,
    settings: type[S],
    environ: Mapping[str, str] = os.environ,
    listeners: Callable[[S], Sequence[Listener]] = default_listeners,
) -> int:
    """Run ``service`` until SIGTERM; returns the process exit status.

    ``settings`` is the service's settings class (``Settings`` or its own subclass), read
    from ``environ``. ``listeners`` chooses the sockets from the settings (the extender adds
    its TLS webhook listener). Returns 2 for unusable settings (including an unusable TLS
    certificate, listen address or Kubernetes configuration found while starting) and 1 for
    other failures, which are logged with their traceback.
    """
    try:
        read = settings.from_env(environ, service=service)
    except SettingsError as exc:
        print(f"rgpu-{service}: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    configure_logging(read.log.level, read.log.format)
    provider = setup_telemetry(f"rgpu-{service}", environ, traces=read.traces)
    try:
        app = instrument_app(create_app(read), provider)
        anyio.run(_serve, app, listeners(read), backend_options={"use_uvloop": True})
    except Exception as exc:
        return _failed(service, lone(exc))
    finally:
        if provider is not None:
            _flush_spans(provider.shutdown)
    return 0


def _flush_spans(shutdown: Callable[[], object]) -> None:
    # The exporter retries an unreachable collector for up to its 10 s timeout; a stopping
    # service must still be gone within about 5 s of SIGTERM, so the last spans get a bounded
    # try in a thread the exit does not wait for.
    flushing = threading.Thread(target=shutdown, name="span-flush", daemon=True)
    flushing.start()
    flushing.join(SPAN_FLUSH_SECONDS)


def _failed(service: str, exc: BaseException) -> int:
    if isinstance(exc, SettingsError):
        logger.error("rgpu-%s cannot start: %s", service, exc)
        return EXIT_BAD_SETTINGS
    logger.error("rgpu-%s failed: %s", service, exc, exc_info=exc)
    return EXIT_FAILED


async def _serve(app: ASGIApp, listeners: Sequence[Listener]) -> None:
    await serve_listeners(app, listeners)
