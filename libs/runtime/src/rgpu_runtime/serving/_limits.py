"""The counters that show a listener's limits being held or refused.

The limits themselves are settings (``rgpu_runtime.settings.ListenerLimits``); ``_lobby``
and ``_guardedhttp`` enforce them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["LISTENER_METRICS_STATE", "REJECTION_REASONS", "ListenerMetrics"]

LISTENER_METRICS_STATE = "rgpu.listener_metrics"
"""The lifespan state key under which ``create_service_app`` hands its ``ListenerMetrics`` to
the server, so the counters land on the service's own registry."""

REJECTION_REASONS = (
    "listener_connections",
    "client_connections",
    "header_bytes",
    "header_timeout",
    "tls_handshake",
    "large_requests",
    "queue_timeout",
)
"""Why a listener refused or closed a connection or request (``rgpu_http_rejected_total``):
over the listener's connection cap, over one client address's cap, a request head over its
byte limit (431), a head not complete within its deadline (408, closed), a TLS handshake that
failed or did not finish within that deadline, and (the extender's webhook) a large request
beyond the concurrent allowance of its client address or of the listener, or one that waited
too long for its client's turn (429)."""


class ListenerMetrics:
    """``rgpu_http_connections{listener}`` and ``rgpu_http_rejected_total{listener,reason}``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections = Gauge(
            "rgpu_http_connections",
            "Connections a listener holds open now (TLS handshakes included).",
            ["listener"],
            registry=registry,
        )
        self.rejected = Counter(
            "rgpu_http_rejected_total",
            "Connections or requests a listener refused or closed by its limits, by reason.",
            ["listener", "reason"],
            registry=registry,
        )

    def follow(self, listener: str) -> None:
        """Show ``listener``'s series at zero before its first connection or refusal."""
        self.connections.labels(listener)
        for reason in REJECTION_REASONS:
            self.rejected.labels(listener, reason)
