"""Logs, traces and latency, set up the same way in every service.

``main`` configures logging and the tracer provider; everything else only asks for a tracer,
observes a histogram with ``trace_exemplar()``, or tells a pod's story (``pod_span``,
``TRACE_ANNOTATION``), so one pod's scheduling reads as one trace across services.
"""

from __future__ import annotations

from ._exemplar import EXEMPLAR_TRACE_ID, trace_exemplar
from ._latency import LatencyMiddleware, latency_histogram
from ._logging import configure_logging
from ._podtrace import (
    CREATION_LINK,
    TRACE_ANNOTATION,
    PodCreations,
    creation_context,
    creation_of,
    link_creation,
    pod_attributes,
    pod_span,
    traceparent_of,
)
from ._tracing import instrument_app, setup_telemetry

__all__ = [
    "CREATION_LINK",
    "EXEMPLAR_TRACE_ID",
    "TRACE_ANNOTATION",
    "LatencyMiddleware",
    "PodCreations",
    "configure_logging",
    "creation_context",
    "creation_of",
    "instrument_app",
    "latency_histogram",
    "link_creation",
    "pod_attributes",
    "pod_span",
    "setup_telemetry",
    "trace_exemplar",
    "traceparent_of",
]
