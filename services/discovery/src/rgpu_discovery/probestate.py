"""Probe results must be folded into what the fleet says about a
server by one rule, or a single lost packet would flap a server out of the fleet.

The rule: a server is unreachable only after two probes in a row got no answer; a reply that
carried a readable usage report replaces the busy set (even with an empty one); a ``404``
means the build reports no usage (busy unknown, not busy-free); every other outcome keeps the
last busy set, because forgetting a busy GPU on a hiccup would double-book it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from rgpu_contracts.ids import GpuUuid

from .lupine import ProbeOutcome

__all__ = ["UNREACHABLE_AFTER", "ProbeState"]

UNREACHABLE_AFTER: Final = 2
"""Consecutive unanswered probes before a server counts as unreachable."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeState:
    """What probing knows about one server; the default is "never probed"."""

    reachable: bool = True
    usage_reported: bool = False
    busy: frozenset[GpuUuid] = frozenset()
    failures: int = 0
    probed: bool = False

    def after(self, outcome: ProbeOutcome) -> ProbeState:
        """The state once ``outcome`` is known."""
        if not outcome.answered:
            failures = self.failures + 1
            return replace(
                self, failures=failures, reachable=failures < UNREACHABLE_AFTER, probed=True
            )
        alive = replace(self, failures=0, reachable=True, probed=True)
        if outcome.result == "usage":
            return replace(alive, usage_reported=True, busy=outcome.busy)
        if outcome.result == "no_usage":
            return replace(alive, usage_reported=False, busy=frozenset())
        return alive
