"""Services call each other the same way, fast, with typed failures.

``http_client`` builds an ``httpx.AsyncClient`` with explicit timeouts, keep-alive, no
proxy-from-environment surprises, and by default the ``httpx_aiohttp`` transport (about twice
as fast per loopback hop as httpx's own, docs/design.md §9). The transport is wrapped in
OpenTelemetry's ``AsyncOpenTelemetryTransport``, which opens a client span and injects W3C
``traceparent``: ``HTTPXClientInstrumentor`` patches only ``httpx.AsyncHTTPTransport`` and so
never sees the aiohttp transport.

``request_json`` is the one call services make: it sends JSON, decodes the answer with a
contract's ``from_dict`` and turns every failure into ``Unavailable`` (retry later) or
``UpstreamError`` (the peer said no, or sent garbage), with the peer's ``ErrorBody`` when it
sent one. No httpx or aiohttp exception leaves this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport
from opentelemetry.instrumentation.httpx import AsyncOpenTelemetryTransport

from rgpu_contracts import ContractError, ErrorBody
from rgpu_runtime.errors import Unavailable, UpstreamError

__all__ = ["http_client", "request_json", "response_error", "upstream_error"]

T = TypeVar("T")

CONNECT_TIMEOUT = 2.0
"""Seconds to open a connection; loopback and in-cluster connects take well under a millisecond,
so anything slower is a dead peer, not a busy one."""

LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=30.0)
"""Keep-alive for 30 s, below the 75 s our servers keep idle connections, so a client never
reuses a connection the server is closing."""

_UNAVAILABLE_STATUSES = frozenset({429, 502, 503, 504})
_TRANSPORT_ERRORS = (httpx.TransportError, aiohttp.ClientError, TimeoutError, OSError)
_CALL_ERRORS = (httpx.HTTPError, *_TRANSPORT_ERRORS)

QueryParams = Mapping[str, str | int | float | bool]


def http_client(
    *, base_url: str, timeout: float, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """Create a client for one peer; use it as ``async with`` inside the service's lifespan.

    ``timeout`` (seconds) bounds each read, write and wait for a pooled connection; connects
    are capped at ``CONNECT_TIMEOUT``. ``transport`` replaces the aiohttp transport (tests
    pass ``httpx.MockTransport`` or ``httpx.ASGITransport``).
    """
    inner = transport if transport is not None else AiohttpTransport(limits=LIMITS, trust_env=False)
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=_timeouts(timeout),
        transport=AsyncOpenTelemetryTransport(inner),
        trust_env=False,
        headers={"accept": "application/json"},
    )


async def request_json(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    decode: Callable[[Mapping[str, object]], T],
    body: object = None,
    params: QueryParams | None = None,
    timeout: float | None = None,
) -> T:
    """Send ``body`` as JSON and decode the JSON object answer with ``decode``.

    ``timeout`` overrides the client's read, write and pool timeouts (long-polls wait longer
    than ordinary calls); connects stay capped at ``CONNECT_TIMEOUT``. Raises
    ``Unavailable`` when the peer cannot be reached, times out or answers 429/5xx, and
    ``UpstreamError`` when it answers another error or a body ``decode`` rejects.
    """
    peer = _peer(client, url)
    content = None if body is None else orjson.dumps(body)
    headers = {"content-type": "application/json"} if content is not None else None
    request_timeout = httpx.USE_CLIENT_DEFAULT if timeout is None else _timeouts(timeout)
    try:
        response = await client.request(
            method, url, content=content, params=params, headers=headers, timeout=request_timeout
        )
    except _CALL_ERRORS as exc:
        raise upstream_error(exc, peer=peer) from exc
    if response.is_error:
        raise response_error(response, peer=peer)
    return _decode(response, decode, peer)


def _timeouts(seconds: float) -> httpx.Timeout:
    # A long-poll may wait long for an answer, never for a connection to a dead peer.
    return httpx.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT))


def _peer(client: httpx.AsyncClient, url: str) -> str:
    return str(client.base_url.join(url).copy_with(query=None))


def _decode(response: httpx.Response, decode: Callable[[Mapping[str, object]], T], peer: str) -> T:
    try:
        raw = orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise UpstreamError(
            f"{peer} answered {response.status_code} with a body that is not JSON: {exc}",
            peer_status=response.status_code,
        ) from exc
    if not isinstance(raw, dict):
        raise UpstreamError(
            f"{peer} answered with JSON that is not an object", peer_status=response.status_code
        )
    try:
        return decode(raw)
    except ContractError as exc:
        raise UpstreamError(
            f"{peer} answered with a body that does not match the contract: {exc}",
            peer_status=response.status_code,
        ) from exc


def upstream_error(exc: Exception, *, peer: str) -> Unavailable | UpstreamError:
    """Map an httpx (or underlying aiohttp/socket) failure calling ``peer`` to our errors."""
    if isinstance(exc, httpx.HTTPStatusError):
        return response_error(exc.response, peer=peer)
    if _timed_out(exc):
        return Unavailable(f"{peer} did not answer in time ({_describe(exc)}); retry later")
    if isinstance(exc, _TRANSPORT_ERRORS):
        return Unavailable(f"cannot reach {peer} ({_describe(exc)}); is it running?")
    return UpstreamError(f"request to {peer} failed: {_describe(exc)}")


def _timed_out(exc: Exception) -> bool:
    # httpx_aiohttp reports every aiohttp connection failure, a refused connect included, as
    # httpx.ConnectTimeout; the aiohttp exception it chains tells what really happened.
    cause = exc.__cause__
    if isinstance(cause, aiohttp.ClientError):
        return isinstance(cause, TimeoutError)
    return isinstance(exc, httpx.TimeoutException | TimeoutError)


def response_error(response: httpx.Response, *, peer: str) -> Unavailable | UpstreamError:
    """Map an error answer from ``peer`` (its status, its ``ErrorBody`` if any) to our errors."""
    status = response.status_code
    peer_body = _error_body(response)
    said = peer_body.message if peer_body is not None else response.reason_phrase
    if status in _UNAVAILABLE_STATUSES:
        return Unavailable(
            f"{peer} is unavailable ({status}): {said}",
            retry_after=_retry_after(response),
        )
    return UpstreamError(
        f"{peer} answered {status}: {said}", peer_status=status, peer_body=peer_body
    )


def _error_body(response: httpx.Response) -> ErrorBody | None:
    try:
        return ErrorBody.from_dict(orjson.loads(response.content))
    except (orjson.JSONDecodeError, ContractError, httpx.ResponseNotRead):
        return None


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text[:300]}" if text else name
