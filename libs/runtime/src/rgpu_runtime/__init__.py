"""rgpu_runtime: the thin plumbing every rgpu service shares.

Settings from the environment, the error tree, the Starlette app factory with health,
readiness, metrics and JSON error handling, the long-poll server side (``Poll``) and
client (``Follower``), backoff, the Kubernetes and HTTP client factories, logging,
telemetry, serving and ``main``.
"""

from __future__ import annotations

from ._app import ServiceLifespan, create_service_app
from ._authguard import (
    ALLOCATOR_AUDIENCE,
    CALLER_AUTH_STATE,
    DISCOVERY_AUDIENCE,
    ROUTE_CALLERS,
    Caller,
    CallerAuth,
    VerdictCache,
    Verdicts,
    audience_of,
    caller_auth,
    caller_of,
    require_caller,
)
from ._backoff import Backoff
from ._bodylimit import BodyLimitMiddleware, body_limit
from ._bounds import (
    ADMISSION_REVIEW_MAX_BYTES,
    DNS_LABEL_MAX,
    DNS_SUBDOMAIN_MAX,
    MAX_JSON_DEPTH,
    UID_MAX,
    bounded_int,
    check_dns_label,
    check_dns_subdomain,
    check_uid,
    decode_json,
    read_bounded_json,
)
from ._bucket import TokenBucket
from ._changelog import CHANGELOG_LIMIT, Changelog, Changes
from ._edge import MAX_BODY_BYTES, json_response, read_json, state_value
from ._election import Election, ElectionTiming
from ._http import http_client, request_json, response_error, upstream_error
from ._kube import KubeClient, Listing, kube_client
from ._limits import LISTENER_METRICS_STATE, ListenerLimits, ListenerMetrics
from ._logging import JsonFormatter, configure_logging
from ._longpoll import DEFAULT_WAIT_SECONDS, MAX_SINCE_DIGITS, MAX_WAIT_SECONDS, Poll
from ._longpoll_follower import Follower, FollowPolicy, FollowStatus, Update
from ._main import default_listeners, run_service
from ._membership import HashRing, Membership, MembershipTiming, member_lease_name
from ._parse import HostPort
from ._readiness import Readiness
from ._recorder import EventRecorder, KubeEvent, ObjectRef, event_body
from ._reflector import (
    ObjectChange,
    Reflector,
    ReflectorTiming,
    WatchTrouble,
    kube_pages,
    object_key,
)
from ._serving import Listener, running, serve, serve_listeners
from ._settings import (
    DEFAULT_MAX_BODY_BYTES,
    KNOWN_KEYS,
    SERVICES,
    AuthSettings,
    HttpSettings,
    KubeSettings,
    LogSettings,
    LupineSettings,
    PeerSettings,
    ResourceSettings,
    SchedulingSettings,
    Settings,
)
from ._telemetry import instrument_app, setup_telemetry, tracer
from ._tokensource import (
    BearerAuth,
    FileTokenSource,
    TokenRequestSource,
    TokenSource,
    bearer_auth,
)
from ._uvicorn import EmbeddedServer
from ._versioned import Versioned
from ._watch import WatchEvent
from .errors import (
    BadRequest,
    Conflict,
    Forbidden,
    KubeConflict,
    KubeError,
    KubeExpired,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
    NotFound,
    PayloadTooLarge,
    RgpuError,
    SettingsError,
    Unauthorized,
    Unavailable,
    UpstreamError,
)

__all__ = [
    "ADMISSION_REVIEW_MAX_BYTES",
    "ALLOCATOR_AUDIENCE",
    "CALLER_AUTH_STATE",
    "CHANGELOG_LIMIT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_WAIT_SECONDS",
    "DISCOVERY_AUDIENCE",
    "DNS_LABEL_MAX",
    "DNS_SUBDOMAIN_MAX",
    "KNOWN_KEYS",
    "LISTENER_METRICS_STATE",
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_SINCE_DIGITS",
    "MAX_WAIT_SECONDS",
    "ROUTE_CALLERS",
    "SERVICES",
    "UID_MAX",
    "AuthSettings",
    "Backoff",
    "BadRequest",
    "BearerAuth",
    "BodyLimitMiddleware",
    "Caller",
    "CallerAuth",
    "Changelog",
    "Changes",
    "Conflict",
    "Election",
    "ElectionTiming",
    "EmbeddedServer",
    "EventRecorder",
    "FileTokenSource",
    "FollowPolicy",
    "FollowStatus",
    "Follower",
    "Forbidden",
    "HashRing",
    "HostPort",
    "HttpSettings",
    "JsonFormatter",
    "KubeClient",
    "KubeConflict",
    "KubeError",
    "KubeEvent",
    "KubeExpired",
    "KubeForbidden",
    "KubeInvalid",
    "KubeNotFound",
    "KubeSettings",
    "KubeUnavailable",
    "Listener",
    "ListenerLimits",
    "ListenerMetrics",
    "Listing",
    "LogSettings",
    "LupineSettings",
    "Membership",
    "MembershipTiming",
    "NotFound",
    "ObjectChange",
    "ObjectRef",
    "PayloadTooLarge",
    "PeerSettings",
    "Poll",
    "Readiness",
    "Reflector",
    "ReflectorTiming",
    "ResourceSettings",
    "RgpuError",
    "SchedulingSettings",
    "ServiceLifespan",
    "Settings",
    "SettingsError",
    "TokenBucket",
    "TokenRequestSource",
    "TokenSource",
    "Unauthorized",
    "Unavailable",
    "Update",
    "UpstreamError",
    "VerdictCache",
    "Verdicts",
    "Versioned",
    "WatchEvent",
    "WatchTrouble",
    "audience_of",
    "bearer_auth",
    "body_limit",
    "bounded_int",
    "caller_auth",
    "caller_of",
    "check_dns_label",
    "check_dns_subdomain",
    "check_uid",
    "configure_logging",
    "create_service_app",
    "decode_json",
    "default_listeners",
    "event_body",
    "http_client",
    "instrument_app",
    "json_response",
    "kube_client",
    "kube_pages",
    "member_lease_name",
    "object_key",
    "read_bounded_json",
    "read_json",
    "request_json",
    "require_caller",
    "response_error",
    "run_service",
    "running",
    "serve",
    "serve_listeners",
    "setup_telemetry",
    "state_value",
    "tracer",
    "upstream_error",
]
