"""Which traces are kept is decided once per trace, at its first span, the same way everywhere.

Two kinds of trace start in an rgpu service. A *request* trace starts with a request from
outside (kube-scheduler's ``/filter``, the apiserver's webhook call) or with work done for one
pod (a span linked to the pod's creation, or carrying ``k8s.pod.uid``): these are what an
operator looks for, and OpenTelemetry's standard ``OTEL_TRACES_SAMPLER`` and
``OTEL_TRACES_SAMPLER_ARG`` decide them. A *background* trace starts with the service's own
periodic work (a probe, a Lease renewal, a sweep, a long-poll to a peer): with 6 servers they
start about ten times a second and say little, so they are kept at
``RGPU_TRACE_BACKGROUND_RATIO`` on top of the standard decision. Every later span follows its
parent (with the ``parentbased_*`` samplers), so a trace is kept or dropped whole, across
services.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from rgpu_runtime.settings import TraceSettings

__all__ = ["trace_sampler"]

POD_UID = "k8s.pod.uid"


def trace_sampler(settings: TraceSettings) -> Sampler:
    """The sampler ``settings`` describe, with background traces thinned at their root."""
    base = settings.sampler.removeprefix("parentbased_")
    first: Sampler = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(settings.ratio),
    }[base]
    roots = _Roots(first, TraceIdRatioBased(settings.background_ratio))
    return ParentBased(roots) if settings.sampler.startswith("parentbased_") else roots


class _Roots(Sampler):
    """The standard decision for every span; a background root must also pass its ratio."""

    def __init__(self, standard: Sampler, background: Sampler) -> None:
        self._standard = standard
        self._background = background

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        result = self._standard.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )
        sampled = result.decision == Decision.RECORD_AND_SAMPLE
        if not sampled or _requested(parent_context, kind, attributes, links):
            return result
        return self._background.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        standard, background = self._standard, self._background
        return f"Roots{{{standard.get_description()},background:{background.get_description()}}}"


def _requested(
    parent_context: Context | None,
    kind: SpanKind | None,
    attributes: Attributes,
    links: Sequence[Link] | None,
) -> bool:
    """Whether a span starts request work (or is no root at all, which this never thins)."""
    parent = trace.get_current_span(parent_context).get_span_context()
    if parent.is_valid or kind == SpanKind.SERVER or links:
        return True
    return bool(attributes and attributes.get(POD_UID))
