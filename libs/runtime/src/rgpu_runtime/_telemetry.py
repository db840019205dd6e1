"""Every cross-service call carries one trace, set up the same way.

``setup_telemetry`` runs once in ``main()``: a ``TracerProvider`` named after the service,
an OTLP/HTTP exporter only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces-specific
variable) is set, and W3C tracecontext + baggage propagation. Without an endpoint no SDK
provider is installed: spans stay non-recording and cost next to nothing, yet an incoming
``traceparent`` still flows on to peers, so traces survive a service that does not export.
``instrument_app`` wraps the ASGI app so each request continues its caller's trace; the
HTTP client side lives in ``http_client``. Tests build their own provider and pass it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp

__all__ = ["instrument_app", "setup_telemetry", "tracer"]

UNTRACED_PATHS = "healthz,readyz,metrics"
"""Probe and scrape paths: they run every few seconds and would drown real traces."""


def setup_telemetry(
    service_name: str, environ: Mapping[str, str] = os.environ
) -> TracerProvider | None:
    """Install the global provider and propagator; returns the provider to shut down at exit.

    Returns ``None`` (nothing exported) when no OTLP endpoint is configured or
    ``OTEL_SDK_DISABLED=true``.
    """
    propagate.set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    )
    provider = exporting_provider(service_name, environ)
    if provider is not None:
        trace.set_tracer_provider(provider)
    return provider


def exporting_provider(service_name: str, environ: Mapping[str, str]) -> TracerProvider | None:
    """A provider exporting over OTLP/HTTP as ``environ`` says, or ``None`` when it says not to."""
    endpoint = _traces_endpoint(environ)
    if endpoint is None or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def _traces_endpoint(environ: Mapping[str, str]) -> str | None:
    specific = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if specific:
        return specific
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return f"{base.rstrip('/')}/v1/traces" if base else None


def instrument_app(app: ASGIApp, provider: TracerProvider | None = None) -> ASGIApp:
    """Wrap ``app`` so each request gets a server span continuing the caller's trace."""
    return OpenTelemetryMiddleware(app, excluded_urls=UNTRACED_PATHS, tracer_provider=provider)


def tracer(name: str) -> trace.Tracer:
    """The tracer services create their own spans with (``tracer(__name__)``)."""
    return trace.get_tracer(name)
