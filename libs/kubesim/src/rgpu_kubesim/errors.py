"""Errors raised by the simulated cluster.

Everything the simulator raises on purpose derives from one base, so callers can tell a
simulated apiserver refusal from a bug::

    KubesimError                  base class; never raised itself
    ├── ApiError                  a request failed exactly as kube-apiserver would fail it;
    │                             carries the Kubernetes ``Status`` body and HTTP code
    ├── FaultSpecError            a fault-injection setting is out of range (also a ValueError)
    └── WebhookCallError          an admission webhook could not be called or answered badly;
                                  subject to the webhook's failurePolicy, never leaves the server
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class KubesimError(Exception):
    """Base class of every error the simulator raises deliberately."""


class ApiError(KubesimError):
    """Raised by `Store` methods and turned into HTTP responses by the server.

    ``status`` is the complete ``Status`` object kube-apiserver would return (kind, apiVersion,
    metadata, status, message, reason, details, code); ``code`` is its HTTP status code.
    """

    def __init__(self, status: Mapping[str, Any]) -> None:
        self.status: dict[str, Any] = dict(status)
        self.code: int = int(self.status["code"])
        self.reason: str = str(self.status.get("reason", ""))
        super().__init__(str(self.status.get("message", "")))

    @property
    def retry_after(self) -> int | None:
        """Seconds the client should wait before retrying, when the Status says so."""
        details = self.status.get("details") or {}
        seconds = details.get("retryAfterSeconds")
        return int(seconds) if seconds else None


class FaultSpecError(KubesimError, ValueError):
    """Raised when a fault setting is invalid (rate outside 0..1, code outside 400..599, ...).

    The message names the field and the accepted range.
    """


class WebhookCallError(KubesimError):
    """Raised when an admission webhook cannot be reached, times out or answers malformed.

    kube-apiserver applies the webhook's ``failurePolicy`` to exactly this class of failure:
    ``Ignore`` skips the webhook, ``Fail`` rejects the request with a 500 ``InternalError``.
    """

    def __init__(self, webhook: str, reason: str) -> None:
        self.webhook = webhook
        super().__init__(f'failed calling webhook "{webhook}": {reason}')
