"""An operator asks "why are GPU pods not scheduling?" of Prometheus and the traces
first; the extender answers with each verb's span, latency and outcome, the webhook's decisions
and whether pod events are being written or dropped, all on the app's own registry.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rgpu_runtime.telemetry import pod_attributes, trace_exemplar

__all__ = ["ExtenderMetrics", "VerbOutcome", "label_attributes", "observed"]

tracer = trace.get_tracer(__name__)

BUCKETS = (
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2,
    4,
    8,
)
"""Seconds; a filter that reads an admitted pod's booking takes about a millisecond, one
that books costs a loopback hop and a write more and must stay inside the 4 s budget, so the
buckets are dense below 10 ms and end just past the budget."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtenderMetrics:
    """The extender's own series; build one per app with ``create``."""

    verb_seconds: Histogram
    """``rgpu_extender_verb_duration_seconds{verb,outcome}``: time spent deciding a verb."""
    outcomes: Counter
    """``rgpu_extender_outcomes_total{verb,outcome}``: how each verb ended (fit, no_fit, ...)."""
    webhook: Counter
    """``rgpu_extender_webhook_decisions_total{operation,decision}``: mutated/denied/..."""
    events: Counter
    """``rgpu_extender_events_total{reason,result}``: pod events written, skipped or dropped."""
    discovery_age: Gauge
    """``rgpu_extender_discovery_age_seconds{stream}``: seconds since discovery last answered
    the ``fleet`` or ``topology`` long-poll, read at scrape time (infinite before the first)."""

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ExtenderMetrics:
        return cls(
            verb_seconds=Histogram(
                "rgpu_extender_verb_duration_seconds",
                "Time to decide one extender or webhook verb, by outcome.",
                ("verb", "outcome"),
                registry=registry,
                buckets=BUCKETS,
            ),
            outcomes=Counter(
                "rgpu_extender_outcomes",
                "Extender verbs by how they ended.",
                ("verb", "outcome"),
                registry=registry,
            ),
            webhook=Counter(
                "rgpu_extender_webhook_decisions",
                "Admission webhook decisions.",
                ("operation", "decision"),
                registry=registry,
            ),
            events=Counter(
                "rgpu_extender_events",
                "Pod events by reason and what happened to them.",
                ("reason", "result"),
                registry=registry,
            ),
            discovery_age=Gauge(
                "rgpu_extender_discovery_age_seconds",
                "Seconds since discovery last answered each long-poll the extender follows.",
                ("stream",),
                registry=registry,
            ),
        )

    def follow_ages(self, age: Callable[[str], float]) -> None:
        """Read each stream's age from ``age`` whenever Prometheus scrapes."""
        for stream in ("fleet", "topology"):
            self.discovery_age.labels(stream).set_function(partial(age, stream))

    def verb_done(self, verb: str, outcome: str, seconds: float) -> None:
        """Record one finished verb, with the current trace as the exemplar."""
        self.verb_seconds.labels(verb, outcome).observe(seconds, trace_exemplar())
        self.outcomes.labels(verb, outcome).inc()


class VerbOutcome(Protocol):
    """What every verb's outcome tells spans and metrics."""

    @property
    def outcome(self) -> str:
        """One word for how the verb ended (``fit``, ``no_fit``, ``bound``, ...)."""
        ...

    @property
    def pod(self) -> str:
        """``namespace/name`` of the pod, or empty when the request named none."""
        ...


OutcomeT = TypeVar("OutcomeT", bound=VerbOutcome)


async def observed(
    verb: str, metrics: ExtenderMetrics, decision: Awaitable[OutcomeT], started: float
) -> OutcomeT:
    """Await ``decision`` in the span ``extender.<verb>`` and record it, timed from ``started``
    (a ``time.perf_counter()`` reading)."""
    with tracer.start_as_current_span(f"extender.{verb}") as span:
        outcome = await decision
        span.set_attributes(label_attributes(outcome.pod))
        span.set_attribute("rgpu.outcome", outcome.outcome)
    metrics.verb_done(verb, outcome.outcome, time.perf_counter() - started)
    return outcome


def label_attributes(label: str) -> dict[str, str]:
    """The span attributes naming the pod of a ``namespace/name`` label (none when empty).

    A pod created with ``generateName`` has no name yet at admission (its label ends in
    ``*``): only its namespace is known.
    """
    namespace, _, name = label.partition("/")
    if not name:
        return {}
    return pod_attributes(namespace=namespace, name="" if name.endswith("*") else name)
