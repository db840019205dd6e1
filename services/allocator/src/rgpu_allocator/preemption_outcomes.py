"""What one preemption attempt amounted to, named once: the booking path, the admitter and the
metric label all read the same outcome, and the rule for an eviction set stopped half-way
(keep the promise, evict the rest next time) is written in one place."""

from __future__ import annotations

import enum
import logging

from rgpu_contracts import ServerName

from .evicting import Evicted
from .pods import PodInfo

__all__ = ["Outcome", "judged", "may_preempt"]

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """What one preemption attempt did (the metric label)."""

    NOMINATED = "nominated"
    """Victims evicted, the server promised to the pod."""
    PENDING = "pending"
    """The pod already holds a live nomination: nothing more is evicted."""
    NONE = "none"
    """No server can be freed for it (no holder of lower priority stands in the way alone)."""
    BLOCKED = "blocked"
    """Every candidate's eviction was refused (PodDisruptionBudgets) or taken meanwhile."""
    FAILED = "failed"
    """The apiserver failed; the pod's next retry tries again."""
    PARTIAL = "partial"
    """Some victims were evicted, then a later eviction was refused although its dry run was
    allowed (a budget changed meanwhile) or failed (the apiserver shed it): the server stays
    promised to the pod, and its next attempt evicts the rest."""
    RESUMED = "resumed"
    """The pod's nomination stood with victims left by a ``partial`` attempt; they are
    evicted now."""

    @property
    def holds(self) -> bool:
        """Whether the pod holds a live nomination after this attempt (it waits for it)."""
        return self in (Outcome.NOMINATED, Outcome.PENDING, Outcome.PARTIAL, Outcome.RESUMED)


def may_preempt(pod: PodInfo | None) -> bool:
    """Whether ``pod`` may evict others: a priority above 0 and ``preemptionPolicy`` not Never."""
    return pod is not None and pod.priority > 0 and not pod.never_preempts and not pod.finished


def judged(key: str, server: ServerName, evicted: Evicted, of: int) -> Outcome:
    """What evicting a set amounted to. Stopped after some went, the promise stays: the
    pod waits for that server, and its next attempt evicts the rest, because taking
    another server would leave the ones that went evicted for nothing."""
    stopped = evicted.stopped
    if stopped is None:
        return Outcome.NOMINATED
    if evicted.done:
        logger.warning(
            "preemption for %s on %s evicted %d of %d victims, then stopped: %s; the "
            "server stays promised and the rest are evicted on its next attempt",
            *(key, server, evicted.done, of, stopped),
        )
        return Outcome.PARTIAL
    if evicted.refused:
        logger.info("preemption for %s on %s refused: %s", key, server, stopped)
        return Outcome.BLOCKED
    logger.warning("preemption for %s on %s failed: %s", key, server, stopped)
    return Outcome.FAILED
