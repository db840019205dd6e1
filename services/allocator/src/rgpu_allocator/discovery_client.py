"""Before refusing a pod for busy cards the allocator asks discovery to probe the server
now, and a slow or absent discovery must surface as one typed error, never a hang.

``POST /v1/servers/{name}/probe`` probes one lupine server now and answers its fresh state.
(The fleet and the topology are followed by long-poll, see ``inputs``.)
"""

from __future__ import annotations

from urllib.parse import quote

import httpx

from rgpu_contracts import Server
from rgpu_runtime import Unavailable, UpstreamError, request_json

from .errors import DiscoveryUnavailable

__all__ = ["DiscoveryClient"]

NOTHING_TO_PROBE = frozenset({404, 409})
"""Discovery's answers for a server it cannot probe: unknown name, or no endpoint."""


class DiscoveryClient:
    """Asks discovery for on-demand probes over an ``httpx.AsyncClient``."""

    __slots__ = ("_http",)

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def probe(self, server: str, timeout: float) -> Server | None:
        """``server``'s state after discovery probed its lupine now (or a moment ago).

        ``None`` when discovery has nothing to probe (unknown server, no endpoint). Raises
        ``DiscoveryUnavailable`` when discovery cannot be reached within ``timeout``, is not
        ready, or answers something that is not a ``Server``.
        """
        path = f"/v1/servers/{quote(server, safe='')}/probe"
        try:
            return await request_json(
                self._http, "POST", path, decode=Server.from_dict, timeout=timeout
            )
        except UpstreamError as exc:
            if exc.peer_status in NOTHING_TO_PROBE:
                return None
            raise DiscoveryUnavailable(f"discovery {path}: {exc.message}") from exc
        except Unavailable as exc:
            raise DiscoveryUnavailable(f"discovery {path}: {exc.message}") from exc
