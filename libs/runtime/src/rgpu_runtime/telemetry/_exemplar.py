"""A slow bar on a latency panel should open the trace that explains it.

Prometheus stores, per histogram bucket, the labels of one recent observation (an
*exemplar*) when it scrapes in the OpenMetrics format; Grafana draws them as points that
open the trace in the trace store. ``trace_exemplar`` gives those labels for the span the
observation was made in: the trace id under the name Grafana's exemplar link expects by
default, and the span id. Only a sampled span qualifies: an unsampled trace was never sent
anywhere, and a point that opens nothing is worse than no point.
"""

from __future__ import annotations

from opentelemetry import trace

__all__ = ["EXEMPLAR_TRACE_ID", "trace_exemplar"]

EXEMPLAR_TRACE_ID = "trace_id"
"""The exemplar label holding the trace id (Grafana's ``exemplarTraceIdDestinations`` name)."""


def trace_exemplar() -> dict[str, str] | None:
    """Exemplar labels of the current span, or ``None`` when it is not sampled."""
    context = trace.get_current_span().get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return None
    return {EXEMPLAR_TRACE_ID: f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
