"""Every cross-service call carries one trace, set up the same way.

``setup_telemetry`` runs once in ``main()``: a ``TracerProvider`` named after the service,
sampling as ``TraceSettings`` say (``_sampling``), an OTLP/HTTP exporter only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces-specific variable) is set, and W3C
tracecontext + baggage propagation. Without an endpoint no SDK
provider is installed: spans stay non-recording and cost next to nothing, yet an incoming
``traceparent`` still flows on to peers, so traces survive a service that does not export.
``instrument_app`` wraps the ASGI app so each request continues its caller's trace, in a
span named after its route template; the HTTP client side lives in ``http_client``, the
apiserver's in ``rgpu_runtime.kube`` (``_spans``). Tests build their own provider and pass it.
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
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rgpu_runtime.settings import TraceSettings

from ._latency import UNMATCHED, route_template
from ._sampling import trace_sampler

__all__ = ["instrument_app", "setup_telemetry", "tracer"]

HTTP_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"))

UNTRACED_PATHS = "healthz,readyz,metrics"
"""Probe and scrape paths: they run every few seconds and would drown real traces."""


def setup_telemetry(
    service_name: str,
    environ: Mapping[str, str] = os.environ,
    *,
    traces: TraceSettings | None = None,
) -> TracerProvider | None:
    """Install the global provider and propagator; returns the provider to shut down at exit.

    ``traces`` defaults to what ``environ`` says (``TraceSettings.from_env``, which raises
    ``SettingsError`` for a bad value). Returns ``None`` (nothing exported) when no OTLP
    endpoint is configured or ``OTEL_SDK_DISABLED=true``.
    """
    propagate.set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    )
    sampling = TraceSettings.from_env(environ) if traces is None else traces
    provider = exporting_provider(service_name, environ, sampling)
    if provider is not None:
        trace.set_tracer_provider(provider)
    return provider


def exporting_provider(
    service_name: str, environ: Mapping[str, str], traces: TraceSettings | None = None
) -> TracerProvider | None:
    """A provider exporting over OTLP/HTTP as ``environ`` says, or ``None`` when it says not to."""
    endpoint = _traces_endpoint(environ)
    if endpoint is None or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: service_name}),
        sampler=trace_sampler(TraceSettings() if traces is None else traces),
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def _traces_endpoint(environ: Mapping[str, str]) -> str | None:
    specific = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if specific:
        return specific
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return f"{base.rstrip('/')}/v1/traces" if base else None


def instrument_app(app: ASGIApp, provider: TracerProvider | None = None) -> ASGIApp:
    """Wrap ``app`` so each request gets a server span continuing the caller's trace.

    The span is named ``<METHOD> <route template>`` (``POST /v1/allocations/{uid}/commit``)
    once routing has matched, and just ``<METHOD>`` when nothing matched: a raw path carries
    ids, and a span name per id makes trace backends' name indexes grow without bound.
    """
    return OpenTelemetryMiddleware(
        _RouteNamedSpans(app),
        excluded_urls=UNTRACED_PATHS,
        default_span_details=_method_only,
        tracer_provider=provider,
        # One span per ASGI message named after the request adds nothing a server span
        # with its status does not already say.
        exclude_spans=["receive", "send"],
    )


def _method_only(scope: Scope) -> tuple[str, dict[str, str]]:
    return _method(scope), {}


def _method(scope: Scope) -> str:
    # Clients choose the method: an unknown one is "HTTP", as OpenTelemetry's conventions
    # say, so it cannot mint span names either.
    method = str(scope.get("method", ""))
    return method if method in HTTP_METHODS else "HTTP"


class _RouteNamedSpans:
    """Renames the current server span after the route the app matched.

    Starlette records the route in the shared scope while routing, so it is known when the
    response starts; the span must be renamed then, because the middleware ends it with the
    last body message, before the app returns.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        root_path = scope.get("root_path", "")
        span = trace.get_current_span()

        async def naming_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                _name_after_route(span, scope, root_path)
            await send(message)

        try:
            await self.app(scope, receive, naming_send)
        finally:
            # An exception before any response leaves the span open until the middleware
            # records it: name it all the same.
            _name_after_route(span, scope, root_path)


def _name_after_route(span: trace.Span, scope: Scope, root_path: str) -> None:
    route = route_template(scope, root_path)
    if route != UNMATCHED and span.is_recording():
        span.update_name(f"{_method(scope)} {route}")
        span.set_attribute("http.route", route)


def tracer(name: str) -> trace.Tracer:
    """The tracer services create their own spans with (``tracer(__name__)``)."""
    return trace.get_tracer(name)
