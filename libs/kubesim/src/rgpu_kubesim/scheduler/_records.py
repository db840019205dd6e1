"""What the scheduler emulator remembers of each pod, for whoever judges a run.

Tests, the demo and the soak read wait times, attempts, refusals and (with tracing) every
step of a pod's way through the queues from these records, after or during a run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One thing that happened to a pod in the scheduler: ``gated`` (created with scheduling
    gates: never tried until they are gone; ``detail`` names them), ``queued`` (created, or its
    last gate removed), ``updated`` (an update of the pod, a nudge included), ``moved`` (a
    cluster event sent it back from the unschedulable pods; ``detail`` says which),
    ``attempt``, ``refused`` and ``error`` (``detail`` is the message) and ``bound``
    (``detail`` the node)."""

    at: float
    """``time.monotonic()``."""
    what: str
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRecord:
    """What happened to one pod: attempts, refusals, errors, and when it was bound where."""

    uid: str
    key: str
    """``namespace/name``."""
    first_seen: float
    """``time.monotonic()`` when the emulator first saw the pod: its creation, a watch hop late."""
    attempts: int = 0
    """Scheduling attempts started (each pop from activeQ)."""
    bound_at: float | None = None
    node: str | None = None
    last_message: str = ""
    refusals: tuple[str, ...] = ()
    """The FitError text of every attempt on which no node fit (the pod went unschedulable)."""
    errors: tuple[str, ...] = ()
    """Every attempt that ended in an error (extender Error, non-200, timeout, bind refused)."""
    steps: tuple[Step, ...] = ()
    """With ``SchedulerConfig.trace``: what the queue did with the pod, in order."""

    queued_at: float | None = None
    """``time.monotonic()`` when the pod entered the scheduling queue: when it was first seen,
    or for a pod created with scheduling gates when its last gate went; ``None`` while gated."""
    filtered_rv: int | None = None
    """The ``resourceVersion`` of the pod as the first extender ``/filter`` call carried it:
    what the pod looked like when rgpu was first asked to place it (``None``: never asked)."""

    @property
    def wait_seconds(self) -> float | None:
        """Seconds from creation to binding (time behind scheduling gates included); ``None``
        while unbound."""
        return None if self.bound_at is None else self.bound_at - self.first_seen

    @property
    def gated_seconds(self) -> float:
        """Seconds the pod waited behind scheduling gates before it was queued (so far, while
        it still waits); 0 for a pod created without gates."""
        end = time.monotonic() if self.queued_at is None else self.queued_at
        return end - self.first_seen
