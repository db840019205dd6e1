"""Every service speaks the same JSON at its HTTP edge.

Handlers read bodies with ``read_json`` (orjson; the app-wide body limit applies while the
body streams in), answer with ``json_response``, and reach lifespan state through
``state_value``. Errors are raised, never caught in handlers: the exception handlers here,
registered once by ``create_service_app``, turn them into an HTTP status plus an
``ErrorBody``. Unknown exceptions get a generic 500 body; Starlette's
``ServerErrorMiddleware`` then re-raises so the server logs the traceback once, and the
traceback never reaches the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import TypeVar

import orjson
from opentelemetry import trace
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from rgpu_contracts import ContractError, ErrorBody
from rgpu_runtime.errors import BadRequest, RgpuError

__all__ = ["json_response", "read_json", "state_value"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


async def read_json(request: Request) -> object:
    """Read the request body as JSON; raises ``BadRequest`` naming line and column if malformed,
    or saying the client left before its body arrived.

    The body is read under the app's size limit (``BodyLimitMiddleware``), so an oversized
    body raises ``PayloadTooLarge`` (413) while it streams, whatever ``Content-Length`` said.
    """
    try:
        body = await request.body()
    except ClientDisconnect as exc:
        # Nobody is left to answer (a caller that timed out, a replica killed mid-request):
        # a 4xx for the record, not a 500 and a traceback for a request that never arrived.
        raise BadRequest(
            "the client closed the connection before its request body arrived"
        ) from exc
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc


def json_response(
    obj: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """Serialise ``obj`` (plain JSON values, e.g. a contract's ``to_dict()``) with orjson."""
    return Response(orjson.dumps(obj), status, headers, media_type="application/json")


def state_value(request: Request, key: str, kind: type[T]) -> T:
    """Return lifespan state ``key`` checked to be a ``kind``: the typed accessor services wrap.

    Raises ``RuntimeError`` when the lifespan did not run (tests must enter
    ``asgi_lifespan.LifespanManager``) or yielded something else under ``key``.
    """
    value = request.scope.get("state", {}).get(key)
    if not isinstance(value, kind):
        raise RuntimeError(
            f"lifespan state {key!r} is {type(value).__name__}, expected {kind.__name__}; "
            "did the lifespan run and yield it? (tests: wrap the app in LifespanManager)"
        )
    return value


def _error_response(
    body: ErrorBody, status: int, headers: Mapping[str, str] | None = None
) -> Response:
    return json_response(body.to_dict(), status, headers)


async def on_rgpu_error(request: Request, exc: Exception) -> Response:
    """Answer an ``RgpuError`` with its status and body (plus ``Retry-After`` when known)."""
    if not isinstance(exc, RgpuError):  # handlers are keyed by class; never reached
        raise exc
    if exc.status_code >= 500:
        logger.warning(
            "%s %s failed: %s",
            request.method,
            request.url.path,
            exc.message,
            extra={"code": exc.code},
        )
    headers = None
    if exc.retry_after is not None:
        headers = {"Retry-After": str(max(1, round(exc.retry_after)))}
    return _error_response(exc.to_body(), exc.status_code, headers)


async def on_contract_error(request: Request, exc: Exception) -> Response:
    """Answer a payload that does not match its contract with 400 naming path and reason."""
    if not isinstance(exc, ContractError):  # handlers are keyed by class; never reached
        raise exc
    body = ErrorBody(code="bad_request", message=f"invalid request body: {exc}", retryable=False)
    return _error_response(body, 400)


async def on_http_exception(request: Request, exc: Exception) -> Response:
    """Answer Starlette's own errors (404, 405) with an ``ErrorBody``."""
    if not isinstance(exc, HTTPException):  # handlers are keyed by class; never reached
        raise exc
    return _error_response(_http_body(request, exc), exc.status_code, exc.headers)


def _http_body(request: Request, exc: HTTPException) -> ErrorBody:
    status = HTTPStatus(exc.status_code)
    if status == HTTPStatus.NOT_FOUND:
        message = f"no route for {request.method} {request.url.path}"
    elif status == HTTPStatus.METHOD_NOT_ALLOWED:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return ErrorBody(code=status.name.lower(), message=message, retryable=False)


async def on_internal_error(request: Request, exc: Exception) -> Response:
    """Answer an unexpected exception with a generic 500; the server logs the traceback."""
    context = trace.get_current_span().get_span_context()
    ref = f" (trace {context.trace_id:032x})" if context.is_valid else ""
    message = f"internal error{ref}; the service logged the details"
    return _error_response(ErrorBody(code="internal", message=message, retryable=False), 500)
