"""Apiserver failures reach services as our errors, split by meaning.

The apiserver answers errors with a ``Status`` object (code, reason, message, details);
``kube_error`` reads it, whatever the transport returned it through (an ``ApiException``,
a raw aiohttp response, or a watch ``ERROR`` event), and picks the ``KubeError`` subclass a
caller acts on: relist on ``KubeExpired``, re-read on ``KubeConflict``, back off on
``KubeUnavailable``. Messages are trimmed so a large body never floods a log line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from rgpu_runtime.errors import (
    KubeConflict,
    KubeError,
    KubeExpired,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
)

MESSAGE_LIMIT = 500
"""Characters of an apiserver message kept; enough for any Status message, bounded for logs."""

_BY_STATUS: Mapping[int, tuple[type[KubeError], str]] = {
    400: (KubeInvalid, "the request was malformed"),
    401: (KubeForbidden, "check the service account token or kubeconfig credentials"),
    403: (KubeForbidden, "check rgpu's RBAC Role and RoleBinding"),
    404: (KubeNotFound, ""),
    409: (KubeConflict, "re-read the object and decide again"),
    410: (KubeExpired, "relist to get a fresh resourceVersion"),
    422: (KubeInvalid, "the object was rejected"),
}


def kube_error(
    op: str, status: int, body: bytes | str | None, headers: Mapping[str, str] | None = None
) -> KubeError:
    """Build the error for an apiserver answer ``status`` with ``body`` to call ``op``."""
    parsed = _status_object(body)
    return status_error(op, status, parsed, _retry_after(parsed, headers))


def status_error(
    op: str, status: int, parsed: Mapping[str, Any], retry_after: float | None = None
) -> KubeError:
    """Build the error for a decoded ``Status`` object (also a watch ``ERROR`` event's)."""
    reason = str(parsed.get("reason") or "")
    message = str(parsed.get("message") or "")[:MESSAGE_LIMIT]
    cls, hint = _BY_STATUS.get(status, (KubeError, ""))
    if status == 429 or status >= 500:
        cls, hint = KubeUnavailable, "the apiserver is overloaded or down; retry later"
    text = f"{op}: {status} {reason or 'error'}: {message or '(no message)'}"
    return cls(
        f"{text}; {hint}" if hint else text,
        kube_status=status,
        kube_reason=reason,
        kube_message=message,
        kube_causes=_causes(parsed),
        retry_after=retry_after,
    )


def _causes(parsed: Mapping[str, Any]) -> tuple[str, ...]:
    details = parsed.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if not isinstance(causes, list):
        return ()
    return tuple(str(c.get("reason")) for c in causes if isinstance(c, dict) and c.get("reason"))


def transport_error(op: str, exc: BaseException) -> KubeUnavailable:
    """Build the error for a call that got no answer (timeout, refused, reset)."""
    detail = str(exc).strip()[:MESSAGE_LIMIT] or type(exc).__name__
    return KubeUnavailable(
        f"{op}: no answer from the apiserver ({type(exc).__name__}: {detail}); retry later"
    )


def _status_object(body: bytes | str | None) -> Mapping[str, Any]:
    if not body:
        return {}
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return {"message": text}
    return parsed if isinstance(parsed, dict) else {}


def _retry_after(parsed: Mapping[str, Any], headers: Mapping[str, str] | None) -> float | None:
    details = parsed.get("details")
    if isinstance(details, dict) and isinstance(details.get("retryAfterSeconds"), int | float):
        return float(details["retryAfterSeconds"])
    value = (headers or {}).get("Retry-After") or (headers or {}).get("retry-after")
    try:
        return float(value) if value else None
    except ValueError:
        return None
