"""The metrics service's one route of its own, ``GET /metrics``, and how a scrape is answered.

It renders from memory only (the board and the app's registry): no call to discovery, the
allocator or the apiserver happens on a scrape, so Prometheus' scrape rate never becomes load
on them, and a scrape answers even while both sources are away. Handlers reach what the
lifespan built through one typed accessor, ``deps``.

One scrape joins two renderings in the format the scraper asked for. The app's own registry
(process, request latency, source health) is small and formatted by prometheus_client on every
scrape; the card families come ready-made from the board. Content negotiation is
prometheus_client's own (``choose_encoder`` on the ``Accept`` header), so the exporter answers
the Prometheus text format or OpenMetrics exactly as any Python exporter would. OpenMetrics
allows a single ``# EOF`` at the very end, so the registry's is moved there.

A 10,000-card scrape is ~17 MB, and copying it costs more than it: joining the pre-rendered
parts into one ``bytes`` would allocate and copy the whole body on every scrape (measured: most
of the scrape time). ``PartsResponse`` sends the parts as they are, as consecutive ASGI body
messages under one ``Content-Length``, so the server writes them straight to the socket.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from rgpu_runtime.serving import state_value

from .board import Board

__all__ = ["ROUTES", "Deps", "Exposition", "PartsResponse", "deps", "expose", "metrics"]

OPENMETRICS = "application/openmetrics-text"
EOF = b"# EOF\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """What request handlers need: the board to render and the app's own registry."""

    board: Board
    registry: CollectorRegistry
    exports_cards: Callable[[], bool] = lambda: True
    """Whether this replica serves the card families (it holds the election Lease)."""


def deps(request: Request) -> Deps:
    """The lifespan's ``Deps`` for this request; raises ``RuntimeError`` if it did not run."""
    return state_value(request, "deps", Deps)


@dataclass(frozen=True, slots=True, kw_only=True)
class Exposition:
    """A rendered scrape: the body, in parts to be sent one after another, and its type."""

    parts: tuple[bytes, ...]
    content_type: str

    @property
    def body(self) -> bytes:
        """The whole body in one piece (tests and tools; the route sends ``parts``)."""
        return b"".join(self.parts)


def expose(
    registry: CollectorRegistry, board: Board, accept: str, *, cards: bool = True
) -> Exposition:
    """Render ``registry`` and, with ``cards``, the board's card families for a scraper
    sending ``accept``."""
    encoder, content_type = choose_encoder(accept)
    openmetrics = content_type.startswith(OPENMETRICS)
    own = encoder(registry)
    parts = board.block().parts(openmetrics=openmetrics) if cards else []
    if openmetrics:
        own = own.removesuffix(EOF)
        parts.append(EOF)
    return Exposition(parts=(own, *parts), content_type=content_type)


class PartsResponse(Response):
    """A response whose body is ``parts`` concatenated, sent without concatenating them."""

    def __init__(
        self, parts: Sequence[bytes], *, content_type: str, status_code: int = 200
    ) -> None:
        self.parts = tuple(part for part in parts if part)
        length = sum(len(part) for part in self.parts)
        super().__init__(
            status_code=status_code,
            headers={"content-type": content_type, "content-length": str(length)},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        last = len(self.parts) - 1
        for index, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": index < last})
        if not self.parts:
            await send({"type": "http.response.body", "body": b""})


async def metrics(request: Request) -> Response:
    """Every card once (HAMi's families and rgpu's) when this replica exports them, plus the
    service's own metrics."""
    d = deps(request)
    accept = request.headers.get("accept", "")
    exposition = expose(d.registry, d.board, accept, cards=d.exports_cards())
    return PartsResponse(exposition.parts, content_type=exposition.content_type)


ROUTES: list[BaseRoute] = [Route("/metrics", metrics, methods=["GET"], name="metrics")]
