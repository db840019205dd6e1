"""Every service reports request latency per route the same way.

A pure ASGI middleware (no ``BaseHTTPMiddleware``: it would buffer streaming bodies and cost
a task per request) times each HTTP request from arrival to the end of the response and
observes ``rgpu_http_request_duration_seconds{service,method,route,status}``. ``route`` is
the matched route *template* (``/v1/claims/{uid}``), never the raw path, so label
cardinality stays bounded whatever callers send. Each observation carries the request's
trace as its exemplar (``_exemplar``): ``instrument_app`` wraps the app outside this
middleware, so the request's server span is current here. The exemplars show in the
OpenMetrics exposition only (``/metrics`` negotiates it from the scraper's ``Accept``); the
plain text format is unchanged.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._exemplar import trace_exemplar

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
"""Seconds; sub-millisecond at the low end because one loopback hop costs ~1 ms (docs/design.md §9),
up to a minute because long-polls hold requests open on purpose."""

UNMATCHED = "<unmatched>"


def latency_histogram(registry: CollectorRegistry) -> Histogram:
    """Create the request-latency histogram in ``registry``."""
    return Histogram(
        "rgpu_http_request_duration_seconds",
        "Time from request arrival to the end of the response, per route template.",
        ("service", "method", "route", "status"),
        registry=registry,
        buckets=BUCKETS,
    )


class LatencyMiddleware:
    """Observe every HTTP request's duration with its route template and final status."""

    def __init__(self, app: ASGIApp, *, histogram: Histogram, service: str) -> None:
        self.app = app
        self.histogram = histogram
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        root_path = scope.get("root_path", "")
        # An exception that escapes before a response starts becomes a 500 further out.
        status = 500

        async def observe_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observe_status)
        finally:
            route = route_template(scope, root_path)
            child = self.histogram.labels(self.service, scope["method"], route, str(status))
            child.observe(time.perf_counter() - started, trace_exemplar())


def route_template(scope: Scope, root_path: str) -> str:
    """The matched route's template, including the prefixes of the mounts it sits in."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return UNMATCHED
    inner_root = scope.get("root_path", "")
    prefix = inner_root[len(root_path) :] if inner_root.startswith(root_path) else ""
    if isinstance(route, Mount):
        return prefix or path
    return prefix + path
