"""The extender follows discovery's fleet (which nodes are servers,
their topology) and topology (client nodes' labels) by long-poll; this is the one place that
knows the URLs, the ``since``/``wait`` parameters and the failure mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import httpx

from rgpu_contracts import Fleet, Topology
from rgpu_runtime import Unavailable, UpstreamError, request_json

from .errors import DiscoveryUnavailable, PeerReplyInvalid

__all__ = ["DiscoveryClient"]

T = TypeVar("T")

SLACK_SECONDS = 5.0
"""Seconds a long-poll may take beyond its ``wait`` before we call discovery unresponsive."""


class DiscoveryClient:
    """Long-poll reads of discovery's fleet and topology."""

    __slots__ = ("_http",)

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def fleet(self, since: int | None, wait: float) -> Fleet:
        """The fleet once its revision differs from ``since`` (or after ``wait`` seconds);
        at once when ``since`` is ``None``.

        Raises ``DiscoveryUnavailable`` or ``PeerReplyInvalid``.
        """
        return await self._poll("/v1/fleet", Fleet.from_dict, since, wait)

    async def topology(self, since: int | None, wait: float) -> Topology:
        """Client nodes' topology labels once the revision differs from ``since``."""
        return await self._poll("/v1/topology", Topology.from_dict, since, wait)

    async def _poll(
        self, url: str, decode: Callable[[Mapping[str, object]], T], since: int | None, wait: float
    ) -> T:
        # Discovery refuses ``wait`` without ``since``: with no revision held there is nothing
        # to wait for, and the answer comes at once.
        params: dict[str, str | int | float | bool] = {}
        if since is not None:
            params = {"since": since, "wait": wait}
        try:
            return await request_json(
                self._http, "GET", url, decode=decode, params=params, timeout=wait + SLACK_SECONDS
            )
        except Unavailable as exc:
            raise DiscoveryUnavailable(f"discovery: {exc.message}") from exc
        except UpstreamError as exc:
            raise PeerReplyInvalid(
                f"discovery: {exc.message}", peer_status=exc.peer_status, peer_body=exc.peer_body
            ) from exc
