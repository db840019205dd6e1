"""The fleet and the client nodes' topology come from discovery by
long-poll, and a slow or absent discovery must surface as one typed error, never a hang.

``GET /v1/fleet`` (and ``/v1/topology``) answers at once; with ``?since=R&wait=S`` it answers
when the revision differs from ``R`` or after ``S`` seconds with the current value.
``POST /v1/servers/{name}/probe`` probes one lupine server now and answers its fresh state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar
from urllib.parse import quote

import httpx

from rgpu_contracts import Fleet, Server, Topology
from rgpu_runtime import Unavailable, UpstreamError, request_json

from .errors import DiscoveryUnavailable

__all__ = ["POLL_WAIT_SECONDS", "DiscoveryClient"]

POLL_WAIT_SECONDS = 30.0
"""How long discovery may hold a long-poll; well under proxies' usual 60 s idle timeout."""

GRACE_SECONDS = 5.0
"""Extra seconds past the hold before the call counts as hung."""

T = TypeVar("T")

NOTHING_TO_PROBE = frozenset({404, 409})
"""Discovery's answers for a server it cannot probe: unknown name, or no endpoint."""


class DiscoveryClient:
    """Reads the fleet and topology from discovery over an ``httpx.AsyncClient``."""

    __slots__ = ("_http",)

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def fleet(self, since: int | None, wait: float = POLL_WAIT_SECONDS) -> Fleet:
        """The fleet, once its revision differs from ``since`` (at once when ``None``).

        Raises ``DiscoveryUnavailable`` when discovery cannot be reached, times out, refuses,
        or answers something that is not a ``Fleet``.
        """
        return await self._poll("/v1/fleet", since, wait, Fleet.from_dict)

    async def topology(self, since: int | None, wait: float = POLL_WAIT_SECONDS) -> Topology:
        """Client nodes' topology labels, long-polled like ``fleet``."""
        return await self._poll("/v1/topology", since, wait, Topology.from_dict)

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

    async def _poll(
        self, path: str, since: int | None, wait: float, decode: Callable[[Mapping[str, object]], T]
    ) -> T:
        params: dict[str, str | int | float | bool] = {}
        if since is not None:
            params = {"since": since, "wait": wait}
        try:
            return await request_json(
                self._http,
                "GET",
                path,
                decode=decode,
                params=params,
                timeout=(wait if since is not None else 0.0) + GRACE_SECONDS,
            )
        except (Unavailable, UpstreamError) as exc:
            raise DiscoveryUnavailable(f"discovery {path}: {exc.message}") from exc
