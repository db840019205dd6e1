"""rgpu_runtime: the thin plumbing every rgpu service shares.

Settings from the environment, the error tree, the Starlette app factory with health,
readiness, metrics and JSON error handling, the long-poll server side (``Poll``) and
client (``Follower``), backoff, the Kubernetes and HTTP client factories, logging,
telemetry, serving and ``main``.
"""

from __future__ import annotations

from ._app import ServiceLifespan, create_service_app
from ._backoff import Backoff
from ._bodylimit import BodyLimitMiddleware
from ._bucket import TokenBucket
from ._edge import MAX_BODY_BYTES, json_response, read_json, state_value
from ._http import http_client, request_json, response_error, upstream_error
from ._kube import KubeClient, Listing, kube_client
from ._logging import JsonFormatter, configure_logging
from ._longpoll import DEFAULT_WAIT_SECONDS, MAX_SINCE_DIGITS, MAX_WAIT_SECONDS, Poll
from ._longpoll_follower import Follower, FollowPolicy, FollowStatus
from ._main import default_listeners, run_service
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
    KNOWN_KEYS,
    SERVICES,
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
from ._versioned import Versioned
from ._watch import WatchEvent
from .errors import (
    BadRequest,
    Conflict,
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
    Unavailable,
    UpstreamError,
)

__all__ = [
    "DEFAULT_WAIT_SECONDS",
    "KNOWN_KEYS",
    "MAX_BODY_BYTES",
    "MAX_SINCE_DIGITS",
    "MAX_WAIT_SECONDS",
    "SERVICES",
    "Backoff",
    "BadRequest",
    "BodyLimitMiddleware",
    "Conflict",
    "EventRecorder",
    "FollowPolicy",
    "FollowStatus",
    "Follower",
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
    "Listing",
    "LogSettings",
    "LupineSettings",
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
    "Unavailable",
    "UpstreamError",
    "Versioned",
    "WatchEvent",
    "WatchTrouble",
    "configure_logging",
    "create_service_app",
    "default_listeners",
    "event_body",
    "http_client",
    "instrument_app",
    "json_response",
    "kube_client",
    "kube_pages",
    "object_key",
    "read_json",
    "request_json",
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
