"""One scrape joins two renderings in the format the scraper asked for.

The app's own registry (process, request latency, source health) is small and formatted by
prometheus_client on every scrape; the card families come ready-made from the board. Content
negotiation is prometheus_client's own (``choose_encoder`` on the ``Accept`` header), so the
exporter answers the Prometheus text format or OpenMetrics exactly as any Python exporter
would. OpenMetrics allows a single ``# EOF`` at the very end, so the registry's is moved there.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from .board import Board

__all__ = ["Exposition", "expose"]

OPENMETRICS = "application/openmetrics-text"
EOF = b"# EOF\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class Exposition:
    """A rendered scrape: the body, in parts to be sent one after another, and its type."""

    parts: tuple[bytes, ...]
    content_type: str

    @property
    def body(self) -> bytes:
        """The whole body in one piece (tests and tools; the route sends ``parts``)."""
        return b"".join(self.parts)


def expose(registry: CollectorRegistry, board: Board, accept: str) -> Exposition:
    """Render ``registry`` and the board's card families for a scraper sending ``accept``."""
    encoder, content_type = choose_encoder(accept)
    openmetrics = content_type.startswith(OPENMETRICS)
    own = encoder(registry)
    parts = board.block().parts(openmetrics=openmetrics)
    if openmetrics:
        own = own.removesuffix(EOF)
        parts.append(EOF)
    return Exposition(parts=(own, *parts), content_type=content_type)
