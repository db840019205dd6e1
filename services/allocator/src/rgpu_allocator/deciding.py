"""Both ways a pod is decided for — booked inside kube-scheduler's ``/filter`` or admitted
behind rgpu's gate — see the same things and apply the same rules: what one decision saw is
computed once, as one value (``Seen``: the pod's demand, the fleet view, who holds what, the
server it is held to by a nomination), and the choice is made on that value alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace

from rgpu_contracts import NodeName, PodRef, ServerName
from rgpu_placement import Choice, Demand, FleetView, Holdings, Refusal, choose
from rgpu_runtime.telemetry import trace_exemplar

from .instruments import Instruments
from .policy import Policy

__all__ = ["Decider", "Seen"]

tracer = trace.get_tracer(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Seen:
    """What one decision about one pod saw."""

    pod: PodRef
    demand: Demand
    view: FleetView
    held: Holdings
    """Who else holds what (``occupancy.Occupancy``, perhaps with in-flight bookings)."""
    nominated: ServerName | None = None
    """The server the pod is held to while its victims leave (it books that or nothing)."""
    candidates: tuple[NodeName, ...] = ()
    """Client nodes the pod may run on, for locality (empty: no preference)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decider:
    """Chooses a server on what was seen, timed in ``rgpu_allocator_decision_seconds``."""

    policy: Policy
    instruments: Instruments

    def decide(self, seen: Seen) -> Choice | Refusal:
        started = time.perf_counter()
        with tracer.start_as_current_span("choose"):
            outcome = choose(
                seen.view,
                seen.demand,
                seen.held,
                candidates=seen.candidates,
                granularity=self.policy.granularity,
                nominated=seen.nominated,
            )
        elapsed = time.perf_counter() - started
        self.instruments.decision_seconds.observe(elapsed, trace_exemplar())
        return outcome
