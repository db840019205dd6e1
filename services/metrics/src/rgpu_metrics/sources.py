"""The exporter's only outbound calls, with their failure modes pinned.

Discovery serves the fleet and the allocator the claims, both as long-polls:
``GET <base><path>`` answers the current value at once; ``GET <base><path>?since=R&wait=S``
answers as soon as the value differs from revision ``R``, or after about ``S`` seconds with
the current value (``304 Not Modified`` is accepted too and means "unchanged"). Every call
has a deadline of ``S`` plus a margin, carries W3C ``traceparent`` (the client comes from
``rgpu_runtime.http_client``, whose transport injects it), and ends with a decoded contract
value, ``None`` (unchanged) or a ``SourceUnavailable``/``SourceInvalid``; no httpx or aiohttp
exception leaves this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import aiohttp
import anyio
import httpx
import orjson
from opentelemetry import trace

from rgpu_contracts import ClaimSet, ContractError, Fleet

from .errors import SourceInvalid, SourceUnavailable

__all__ = ["CLAIMS", "FLEET", "Source", "SourceClient"]

T = TypeVar("T")

tracer = trace.get_tracer(__name__)

# httpx_aiohttp maps most aiohttp failures to httpx ones, but not all; sockets raise OSError.
_CALL_ERRORS = (httpx.HTTPError, aiohttp.ClientError, OSError)


@dataclass(frozen=True, slots=True, kw_only=True)
class Source(Generic[T]):
    """One peer's long-poll endpoint and the contract its body decodes to."""

    name: str
    """Peer service name, used in metrics (``source`` label), errors and logs."""
    path: str
    decode: Callable[[object, str], T]


FLEET: Source[Fleet] = Source(name="discovery", path="/v1/fleet", decode=Fleet.from_dict)
CLAIMS: Source[ClaimSet] = Source(name="allocator", path="/v1/claims", decode=ClaimSet.from_dict)


class SourceClient(Generic[T]):
    """Fetch one source over an ``httpx.AsyncClient`` whose base URL is the peer's."""

    __slots__ = ("_http", "_last_body", "_margin", "source")

    def __init__(self, http: httpx.AsyncClient, source: Source[T], *, margin: float) -> None:
        self._http = http
        self._margin = margin
        self._last_body = b""
        self.source = source

    async def fetch(self, since: int | None, wait: float) -> T | None:
        """The source's value, or ``None`` when it is unchanged since the last fetch.

        "Unchanged" is a ``304``, or a body byte-for-byte equal to the last one decoded: a
        quiet long-poll answers the same value again after ``wait``, and decoding 10,000
        cards again costs ~100 ms for nothing.

        ``since=None`` asks for the current value at once; otherwise the peer may hold the
        request up to ``wait`` seconds. Raises ``SourceUnavailable`` (unreachable, timeout,
        5xx, 429) or ``SourceInvalid`` (any other status, or a body off-contract).
        """
        params = {} if since is None else {"since": str(since), "wait": f"{wait:g}"}
        deadline = self._margin + (0.0 if since is None else wait)
        with tracer.start_as_current_span(f"follow {self.source.name}") as span:
            span.set_attribute("rgpu.source", self.source.name)
            response = await self._get(params, deadline)
        # A 10,000-card fleet takes ~100 ms to decode; in a worker thread the event loop
        # still gets the GIL every few milliseconds, so scrapes are slowed, not stalled.
        return await anyio.to_thread.run_sync(self._decode, response)

    async def _get(self, params: dict[str, str], deadline: float) -> httpx.Response:
        name = self.source.name
        try:
            with anyio.fail_after(deadline):
                return await self._http.get(self.source.path, params=params, timeout=deadline)
        except TimeoutError as exc:
            raise SourceUnavailable(name, f"no answer within {deadline:g} s") from exc
        except _CALL_ERRORS as exc:
            raise SourceUnavailable(name, f"request failed: {type(exc).__name__}: {exc}") from exc

    def _decode(self, response: httpx.Response) -> T | None:
        name, status = self.source.name, response.status_code
        if status == httpx.codes.NOT_MODIFIED:
            return None
        if status == httpx.codes.TOO_MANY_REQUESTS or status >= 500:
            raise SourceUnavailable(name, f"answered HTTP {status}; {_trim(response.text)}")
        if status != httpx.codes.OK:
            detail = f"answered HTTP {status}; {_trim(response.text)}"
            raise SourceInvalid(name, detail, peer_status=status)
        return self._value(response)

    def _value(self, response: httpx.Response) -> T | None:
        name, body = self.source.name, response.content
        if body == self._last_body:
            return None
        try:
            value = self.source.decode(orjson.loads(body), "")
        except orjson.JSONDecodeError as exc:
            raise SourceInvalid(name, f"body is not JSON: {exc}", peer_status=200) from exc
        except ContractError as exc:
            raise SourceInvalid(name, f"body is off-contract: {exc}", peer_status=200) from exc
        self._last_body = body
        return value


def _trim(text: str, limit: int = 200) -> str:
    """Peer bodies go into messages and logs; keep them short."""
    text = text.strip().replace("\n", " ")
    return text if len(text) <= limit else f"{text[:limit]}..."
