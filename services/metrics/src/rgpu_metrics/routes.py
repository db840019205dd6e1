"""The metrics service's one route of its own, ``GET /metrics``.

It renders from memory only (the board and the app's registry): no call to discovery, the
allocator or the apiserver happens on a scrape, so Prometheus' scrape rate never becomes load
on them, and a scrape answers even while both sources are away.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .exposition import expose
from .responses import PartsResponse
from .state import deps

__all__ = ["ROUTES", "metrics"]


async def metrics(request: Request) -> Response:
    """Every card once (HAMi's families and rgpu's), plus the service's own metrics."""
    d = deps(request)
    exposition = expose(d.registry, d.board, request.headers.get("accept", ""))
    return PartsResponse(exposition.parts, content_type=exposition.content_type)


ROUTES: list[BaseRoute] = [Route("/metrics", metrics, methods=["GET"], name="metrics")]
