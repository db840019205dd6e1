"""A pod the emulated kubelet runs: the scopes that end it (the run, the containers' shutdown)
and whether its deletion has begun, shared by the watch that sees the deletion and the task
that runs the pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

__all__ = ["Running", "grace_of", "stopped_within"]


@dataclass(slots=True, kw_only=True)
class Running:
    """A pod this kubelet is running, and whether its deletion has begun."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stop: anyio.Event = field(default_factory=anyio.Event)
    grace: float = 0.0
    kill: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    """Ends the containers' shutdown at the end of the grace period (a second DELETE may
    move that end earlier)."""
    stopping_since: float | None = None


async def stopped_within(running: Running, seconds: float) -> bool:
    """Wait ``seconds`` unless the pod's deletion begins first; True if it did."""
    with anyio.move_on_after(seconds):
        await running.stop.wait()
    return running.stop.is_set()


def grace_of(pod: Mapping[str, Any]) -> float:
    return float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
