"""Lupine servers are probed over the network, and both protocols
lupine builds speak must be handled without a probe ever hanging or raising.

Newer lupine builds answer HTTP/1.1 ``GET /metrics`` on their RPC port; older builds speak
only HTTP/2 (they greet an HTTP/1.1 client with an h2 SETTINGS frame and hang up), so when
HTTP/1.1 fails before any response arrives, an HTTP/2 prior-knowledge ``HEAD /`` decides
whether the server is alive. Every request is bounded by the probe timeout, and every failure
comes back as a ``ProbeOutcome`` value: this is the only module that sees httpx exceptions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Final, Literal

import anyio
import httpx

from rgpu_contracts.ids import GpuUuid

from .usage import UnreadableUsage, busy_gpus

__all__ = ["ANSWERED", "MAX_BODY_BYTES", "LupineProber", "ProbeOutcome", "ProbeResult"]

ProbeResult = Literal[
    "usage", "no_usage", "h2_alive", "http_error", "bad_body", "timeout", "refused", "unreachable"
]
"""``usage``: 200 with a readable busy set; ``no_usage``: 404, this build reports no usage;
``h2_alive``: HTTP/1.1 failed but HTTP/2 answered; ``http_error``: another status;
``bad_body``: truncated, oversized or unreadable body; ``timeout``, ``refused`` (connection
refused or reset while connecting) and ``unreachable`` (neither protocol answered)."""

ANSWERED: Final[frozenset[ProbeResult]] = frozenset(
    {"usage", "no_usage", "h2_alive", "http_error", "bad_body"}
)
"""Results where lupine's port answered: the server is alive, whatever it said."""

MAX_BODY_BYTES: Final = 8 << 20
"""A lupine ``/metrics`` body is a few KiB per client; 8 MiB bounds memory per probe while
leaving room for thousands of clients."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeOutcome:
    """What one probe learned; ``busy`` is meaningful only for ``usage``."""

    result: ProbeResult
    busy: frozenset[GpuUuid] = frozenset()
    detail: str = ""
    seconds: float = 0.0

    @property
    def answered(self) -> bool:
        """Whether the server's lupine port answered at all."""
        return self.result in ANSWERED


class _Truncated(Exception):
    """The body ended early or exceeded the size limit."""


class LupineProber:
    """Probes lupine endpoints (``host:port``); use as an async context manager.

    ``transport``, when given, carries both protocols (tests inject a fake there); otherwise
    one pooled HTTP/1.1 client and one HTTP/2 prior-knowledge client are opened.
    """

    def __init__(
        self,
        *,
        timeout: float,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 64,
    ) -> None:
        self._timeout = timeout
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._h1 = httpx.AsyncClient(
            http1=True, http2=False, transport=transport, limits=limits, timeout=timeout
        )
        self._h2 = httpx.AsyncClient(
            http1=False, http2=True, transport=transport, limits=limits, timeout=timeout
        )

    async def __aenter__(self) -> LupineProber:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close both connection pools."""
        await self._h1.aclose()
        await self._h2.aclose()

    async def probe(self, endpoint: str) -> ProbeOutcome:
        """Probe one lupine endpoint; never raises for network or protocol failures."""
        started = time.perf_counter()
        outcome = await self._metrics(f"http://{endpoint}")
        if outcome is None:
            outcome = await self._liveness(f"http://{endpoint}")
        return replace(outcome, seconds=time.perf_counter() - started)

    async def _metrics(self, base: str) -> ProbeOutcome | None:
        """HTTP/1.1 ``GET /metrics``; ``None`` when it failed before any response arrived."""
        try:
            with anyio.fail_after(self._timeout):
                async with self._h1.stream("GET", f"{base}/metrics") as response:
                    return await _read_usage(response)
        except (TimeoutError, httpx.TimeoutException):
            return ProbeOutcome(result="timeout", detail=f"no answer within {self._timeout} s")
        except httpx.ConnectError as exc:
            return ProbeOutcome(result="refused", detail=_describe(exc))
        except (httpx.TransportError, OSError):
            return None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return ProbeOutcome(result="unreachable", detail=_describe(exc))

    async def _liveness(self, base: str) -> ProbeOutcome:
        """HTTP/2 prior-knowledge ``HEAD /``: any response means lupine is alive."""
        try:
            with anyio.fail_after(self._timeout):
                response = await self._h2.head(f"{base}/")
        except (TimeoutError, httpx.TimeoutException):
            return ProbeOutcome(
                result="timeout", detail=f"no HTTP/2 answer within {self._timeout} s"
            )
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            detail = f"neither HTTP/1.1 nor HTTP/2 answered: {_describe(exc)}"
            return ProbeOutcome(result="unreachable", detail=detail)
        return ProbeOutcome(result="h2_alive", detail=f"HTTP/2 status {response.status_code}")


async def _read_usage(response: httpx.Response) -> ProbeOutcome:
    if response.status_code == 404:
        return ProbeOutcome(result="no_usage", detail="no /metrics on this lupine build")
    if response.status_code != 200:
        return ProbeOutcome(result="http_error", detail=f"/metrics answered {response.status_code}")
    try:
        text = (await _read_body(response)).decode("utf-8")
        return ProbeOutcome(result="usage", busy=busy_gpus(text))
    except (_Truncated, UnicodeDecodeError, UnreadableUsage) as exc:
        return ProbeOutcome(result="bad_body", detail=f"unusable /metrics body: {exc}")


async def _read_body(response: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _Truncated(f"body larger than {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
    except httpx.TimeoutException:
        raise
    except (httpx.TransportError, httpx.DecodingError, OSError) as exc:
        # Past the head, a broken stream is a truncated body, not a dead server.
        raise _Truncated(f"body cut short ({_describe(exc)})") from exc
    return b"".join(chunks)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
