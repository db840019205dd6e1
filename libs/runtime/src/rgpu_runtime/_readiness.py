"""``/readyz`` must say "not yet" until background work has started.

The service's lifespan owns a ``Readiness`` and flips it once every ``await tg.start(...)``
has returned (each watcher called ``task_status.started()``), and may flip it back when a
dependency is lost, so Kubernetes stops routing to a replica that cannot answer well.
"""

from __future__ import annotations

__all__ = ["Readiness"]


class Readiness:
    """A ready flag plus the reason it is not ready; starts not ready ("starting")."""

    __slots__ = ("_ready", "_reason")

    def __init__(self) -> None:
        self._ready = False
        self._reason = "starting"

    @property
    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200."""
        return self._ready

    @property
    def reason(self) -> str:
        """Why it is not ready (empty when ready), shown in the ``/readyz`` body."""
        return self._reason

    def set_ready(self) -> None:
        """Declare every background task started; ``/readyz`` answers 200 from now on."""
        self._ready = True
        self._reason = ""

    def set_not_ready(self, reason: str) -> None:
        """Declare the service unable to serve well; ``/readyz`` answers 503 with ``reason``."""
        self._ready = False
        self._reason = reason
