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

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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

from rgpu_runtime.settings import _parse as p

__all__ = ["SAMPLERS", "TraceSettings", "trace_sampler"]

SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
"""The values of ``OTEL_TRACES_SAMPLER`` rgpu honours (the specification's built-in ones)."""

POD_UID = "k8s.pod.uid"


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSettings:
    """How many traces are kept, read from the standard variables and one of rgpu's."""

    sampler: str = "parentbased_always_on"
    """``OTEL_TRACES_SAMPLER``: the specification's default; every request trace is sent, so a
    collector's tail sampling sees every error and every slow trace."""
    ratio: float = 1.0
    """``OTEL_TRACES_SAMPLER_ARG``: the share of request traces kept by ``traceidratio`` and
    ``parentbased_traceidratio`` (0..1); ignored by the other samplers, as specified."""
    background_ratio: float = 0.1
    """``RGPU_TRACE_BACKGROUND_RATIO``: the share of background traces kept (0..1); one in ten
    turns the ~10 background traces a second of 6 servers into one."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TraceSettings:
        """Read and check the three variables; raises ``SettingsError`` naming a bad one."""
        d = cls()
        text = environ.get("OTEL_TRACES_SAMPLER", "").strip()
        name = text.lower() or d.sampler
        if name not in SAMPLERS:
            raise p.bad("OTEL_TRACES_SAMPLER", text, f"expected one of {', '.join(SAMPLERS)}")
        return cls(
            sampler=name,
            ratio=_ratio(environ, "OTEL_TRACES_SAMPLER_ARG", d.ratio),
            background_ratio=_ratio(environ, "RGPU_TRACE_BACKGROUND_RATIO", d.background_ratio),
        )


def _ratio(environ: Mapping[str, str], key: str, default: float) -> float:
    text = environ.get(key, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise p.bad(key, text, "expected a share of traces between 0 and 1, e.g. 0.25")
    return value


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
