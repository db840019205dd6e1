"""``/readyz`` must say "not yet" until background work has started, and "no" while the
service cannot do its job.

The service's lifespan owns a ``Readiness`` and flips it once every ``await tg.start(...)``
has returned (each watcher called ``task_status.started()``), and may flip it back when a
dependency is lost, so Kubernetes stops routing to a replica that cannot answer well.
Background parts that keep failing on their own (an election, a membership Lease whose
namespace does not exist) ``block`` it under their own key, and ``unblock`` it once they
succeed again: a replica reports ready only when started and blocked by nobody, whatever the
lifespan said last.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Readiness", "Standing"]


class Readiness:
    """A ready flag plus the reason it is not ready; starts not ready ("starting")."""

    __slots__ = ("_blocks", "_ready", "_reason")

    def __init__(self) -> None:
        self._ready = False
        self._reason = "starting"
        self._blocks: dict[str, str] = {}

    @property
    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200."""
        return self._ready and not self._blocks

    @property
    def reason(self) -> str:
        """Why it is not ready (empty when ready), shown in the ``/readyz`` body."""
        if not self._ready:
            return self._reason
        return "; ".join(self._blocks.values())

    def set_ready(self) -> None:
        """Declare every background task started; ``/readyz`` answers 200 from now on (unless
        a part blocks it)."""
        self._ready = True
        self._reason = ""

    def set_not_ready(self, reason: str) -> None:
        """Declare the service unable to serve well; ``/readyz`` answers 503 with ``reason``."""
        self._ready = False
        self._reason = reason

    def block(self, part: str, reason: str) -> None:
        """``part`` cannot do its work: not ready, with ``reason``, until it unblocks."""
        self._blocks[part] = reason

    def unblock(self, part: str) -> None:
        """``part`` works again (a no-op when it was not blocking)."""
        self._blocks.pop(part, None)


class Standing:
    """One background part's standing in a ``Readiness``: it blocks readiness once it has kept
    failing for a given patience, and unblocks it on its next success. No readiness: it only
    keeps time."""

    __slots__ = ("_clock", "_failing_since", "_part", "_readiness")

    def __init__(self, readiness: Readiness | None, part: str, clock: Callable[[], float]) -> None:
        self._readiness = readiness
        self._part = part
        self._clock = clock
        self._failing_since: float | None = None

    def succeeded(self) -> None:
        self._failing_since = None
        if self._readiness is not None:
            self._readiness.unblock(self._part)

    def failed(self, reason: str, *, patience: float) -> None:
        """One more failure; block with ``reason`` once failing for ``patience`` seconds."""
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        if self._readiness is not None and now - self._failing_since >= patience:
            self._readiness.block(self._part, reason)
