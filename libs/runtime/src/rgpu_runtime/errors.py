"""Every service raises and catches the same few errors by meaning.

Inside a service, failures are exceptions; at the HTTP edge (``create_service_app``) each
``RgpuError`` becomes its ``status_code`` and an ``ErrorBody`` with its ``code``, message and
``retryable`` flag. Library exceptions (httpx, aiohttp, kubernetes_asyncio) never cross our
client wrappers: they are re-raised as one of these with ``raise ... from exc``.

Hierarchy::

    Exception
     └── RgpuError                 status_code, code, retryable, retry_after
          ├── BadRequest           400  the caller sent something we cannot use
          ├── Unauthorized         401  no caller token, or one TokenReview did not confirm
          ├── Forbidden            403  a confirmed caller that is not allowed here
          ├── NotFound             404  the thing asked for does not exist (here)
          ├── Conflict             409  the request lost a race or contradicts current state
          ├── PayloadTooLarge      413  a request body over the limit
          ├── Unavailable          503  a dependency is down or slow; retry later  (retryable)
          ├── UpstreamError        502  a peer service answered with an error or garbage
          ├── SettingsError        500  a setting cannot be used; the process must not start
          └── KubeError            502  the Kubernetes API refused or failed a call
               ├── KubeNotFound    404  object absent
               ├── KubeConflict    409  resourceVersion / precondition / already-bound conflict
               ├── KubeExpired     410  watch or list resourceVersion too old: relist
               ├── KubeInvalid     422  the apiserver rejected the object (also 400)
               ├── KubeForbidden   403  RBAC or authentication refused the call (also 401)
               └── KubeUnavailable 503  5xx, 429, timeout or connection failure  (retryable)
"""

from __future__ import annotations

from typing import ClassVar

from rgpu_contracts import ErrorBody

__all__ = [
    "BadRequest",
    "Conflict",
    "Forbidden",
    "KubeConflict",
    "KubeError",
    "KubeExpired",
    "KubeForbidden",
    "KubeInvalid",
    "KubeNotFound",
    "KubeUnavailable",
    "NotFound",
    "PayloadTooLarge",
    "RgpuError",
    "SettingsError",
    "Unauthorized",
    "Unavailable",
    "UpstreamError",
]


class RgpuError(Exception):
    """Base of every error rgpu raises on purpose.

    Subclasses fix ``status_code`` (the HTTP status the edge answers with) and the default
    ``code`` (a stable machine word) and ``retryable``; an instance may override ``code`` and
    ``retryable``, and carry ``retry_after`` (seconds) when the cause said how long to wait.
    """

    status_code: ClassVar[int] = 500
    default_code: ClassVar[str] = "internal"
    default_retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retryable: bool | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.retryable = self.default_retryable if retryable is None else retryable
        self.retry_after = retry_after

    def to_body(self) -> ErrorBody:
        """Render this error as the wire value peers decode."""
        return ErrorBody(code=self.code, message=self.message, retryable=self.retryable)


class BadRequest(RgpuError):
    """Raised when a request is malformed or asks for something impossible; fix the caller."""

    status_code = 400
    default_code = "bad_request"


class Unauthorized(RgpuError):
    """Raised when a guarded route gets no bearer token, or one TokenReview does not confirm;
    send a current projected ServiceAccount token for the receiving service's audience."""

    status_code = 401
    default_code = "unauthorized"


class Forbidden(RgpuError):
    """Raised when a confirmed caller is not on a guarded route's allow-list; run the caller
    as a listed account or list it (``RGPU_ALLOCATION_CALLERS`` or ``RGPU_PROBE_CALLERS``)."""

    status_code = 403
    default_code = "forbidden"


class NotFound(RgpuError):
    """Raised when the requested object is not known to this service."""

    status_code = 404
    default_code = "not_found"


class Conflict(RgpuError):
    """Raised when a request contradicts current state (another writer won); re-read and retry."""

    status_code = 409
    default_code = "conflict"


class PayloadTooLarge(RgpuError):
    """Raised when a request body exceeds the size limit; send less or raise the limit."""

    status_code = 413
    default_code = "payload_too_large"


class Unavailable(RgpuError):
    """Raised when a dependency cannot be reached or did not answer in time; retry later."""

    status_code = 503
    default_code = "unavailable"
    default_retryable = True


class UpstreamError(RgpuError):
    """Raised when a peer service answered, but with an error or an undecodable body.

    ``peer_status`` is the peer's HTTP status (0 when it never sent one) and ``peer_body``
    the ``ErrorBody`` it sent, when it sent one; ``retryable`` follows the peer's body.
    """

    status_code = 502
    default_code = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        peer_status: int = 0,
        peer_body: ErrorBody | None = None,
        retryable: bool | None = None,
    ) -> None:
        if retryable is None and peer_body is not None:
            retryable = peer_body.retryable
        super().__init__(message, retryable=retryable)
        self.peer_status = peer_status
        self.peer_body = peer_body


class SettingsError(RgpuError):
    """Raised at start when a setting (usually an ``RGPU_*`` variable) cannot be used.

    The message names the key, the bad value and what is expected; ``main`` prints it and
    exits with status 2 instead of serving with a silently wrong configuration.
    """

    default_code = "bad_setting"


class KubeError(RgpuError):
    """Raised when a Kubernetes API call fails; subclasses say why.

    ``kube_status`` is the apiserver's HTTP status (0 when none arrived), ``kube_reason`` the
    ``Status.reason`` (``Conflict``, ``NotFound``, ...) and ``kube_message`` its
    ``Status.message`` verbatim (trimmed), so callers can compare e.g. the node a pod is
    already bound to. ``kube_causes`` holds the reasons of ``Status.details.causes``: the
    Eviction API's ``429`` for a disruption budget says ``DisruptionBudget`` there, which
    tells it from a ``429`` of an apiserver shedding load.
    """

    status_code = 502
    default_code = "kube_error"

    def __init__(
        self,
        message: str,
        *,
        kube_status: int = 0,
        kube_reason: str = "",
        kube_message: str = "",
        kube_causes: tuple[str, ...] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.kube_status = kube_status
        self.kube_reason = kube_reason
        self.kube_message = kube_message
        self.kube_causes = kube_causes


class KubeNotFound(KubeError):
    """Raised on 404: the object (or its namespace) does not exist."""

    status_code = 404
    default_code = "kube_not_found"


class KubeConflict(KubeError):
    """Raised on 409: stale resourceVersion, failed precondition, exists, or already bound."""

    status_code = 409
    default_code = "kube_conflict"


class KubeExpired(KubeError):
    """Raised on 410 (also as a watch ERROR event): the resourceVersion is too old; relist."""

    status_code = 502
    default_code = "kube_expired"


class KubeInvalid(KubeError):
    """Raised on 422 or 400: the apiserver rejected the request or object as invalid."""

    status_code = 502
    default_code = "kube_invalid"


class KubeForbidden(KubeError):
    """Raised on 403 or 401: RBAC or authentication refused the call; fix the Role."""

    status_code = 502
    default_code = "kube_forbidden"


class KubeUnavailable(KubeError):
    """Raised on 5xx, 429, timeouts and connection failures; retry after ``retry_after``."""

    status_code = 503
    default_code = "kube_unavailable"
    default_retryable = True
