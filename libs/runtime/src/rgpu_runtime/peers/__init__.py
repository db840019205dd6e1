"""How the services call each other: one HTTP client with typed failures, and the
ServiceAccount tokens that prove who calls (the caller's side) and are checked (the receiver's).
"""

from __future__ import annotations

from ._authguard import (
    ALLOCATOR_AUDIENCE,
    CALLER_AUTH_STATE,
    DISCOVERY_AUDIENCE,
    CallerAuth,
    audience_of,
    caller_auth,
    require_caller,
)
from ._http import http_client, request_json, response_error, upstream_error
from ._tokensource import BearerAuth, TokenRequestSource, bearer_auth

__all__ = [
    "ALLOCATOR_AUDIENCE",
    "CALLER_AUTH_STATE",
    "DISCOVERY_AUDIENCE",
    "BearerAuth",
    "CallerAuth",
    "TokenRequestSource",
    "audience_of",
    "bearer_auth",
    "caller_auth",
    "http_client",
    "request_json",
    "require_caller",
    "response_error",
    "upstream_error",
]
