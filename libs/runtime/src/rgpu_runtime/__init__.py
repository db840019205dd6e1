"""rgpu_runtime: the thin plumbing every rgpu service shares.

Settings from the environment, the error tree, the Starlette app factory with health,
readiness, metrics and JSON error handling, the long-poll feeds (``Feed``), their
publishers' snapshots (``Published``, ``Poll``) and their followers' mirrors (``Mirror``,
``DiscoveryMirror``, ``Follower``), backoff, the Kubernetes and HTTP client factories, logging,
telemetry, serving and ``main``.
"""

from __future__ import annotations

from ._app import ServiceLifespan, create_service_app
from ._authguard import (
    AUDIENCE,
    CALLER_AUTH_STATE,
    Caller,
    CallerAuth,
    VerdictCache,
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
from ._discovery_mirror import DiscoveryMirror, FleetIndex
from ._edge import MAX_BODY_BYTES, json_response, read_json, state_value
from ._election import Election, ElectionTiming
from ._exemplar import EXEMPLAR_TRACE_ID, trace_exemplar
from ._feeds import CLAIMS_FEED, FLEET_FEED, TOPOLOGY_FEED, DeltaLayout, Feed, Update
from ._http import http_client, request_json, response_error, upstream_error
from ._kube import KubeClient, Listing, kube_client
from ._logging import JsonFormatter, configure_logging
from ._longpoll import DEFAULT_WAIT_SECONDS, MAX_SINCE_DIGITS, MAX_WAIT_SECONDS, Poll
from ._longpoll_follower import Follower, FollowPolicy
from ._main import default_listeners, run_service
from ._membership import HashRing, Membership, MembershipTiming, member_lease_name
from ._mirror import FollowStatus, Mirror
from ._parse import HostPort
from ._podtrace import (
    CREATION_LINK,
    TRACE_ANNOTATION,
    PodCreations,
    creation_context,
    creation_of,
    link_creation,
    pod_attributes,
    pod_span,
    traceparent_of,
)
from ._published import Entry, Published, gzip_body, initial_revision
from ._readiness import Readiness, Standing
from ._recorder import EventRecorder, KubeEvent, ObjectRef, event_body
from ._reflector import (
    ObjectChange,
    Reflector,
    ReflectorTiming,
    WatchTrouble,
    kube_pages,
    object_key,
)
from ._sampling import SAMPLERS, TraceSettings, trace_sampler
from ._serving import Listener, running, serve, serve_listeners
from ._settings import (
    DEFAULT_MAX_BODY_BYTES,
    KNOWN_KEYS,
    SERVICES,
    AdmissionSettings,
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
    "AUDIENCE",
    "CALLER_AUTH_STATE",
    "CHANGELOG_LIMIT",
    "CLAIMS_FEED",
    "CREATION_LINK",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_WAIT_SECONDS",
    "DNS_LABEL_MAX",
    "DNS_SUBDOMAIN_MAX",
    "EXEMPLAR_TRACE_ID",
    "FLEET_FEED",
    "KNOWN_KEYS",
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_SINCE_DIGITS",
    "MAX_WAIT_SECONDS",
    "SAMPLERS",
    "SERVICES",
    "TOPOLOGY_FEED",
    "TRACE_ANNOTATION",
    "UID_MAX",
    "AdmissionSettings",
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
    "DeltaLayout",
    "DiscoveryMirror",
    "Election",
    "ElectionTiming",
    "EmbeddedServer",
    "Entry",
    "EventRecorder",
    "Feed",
    "FileTokenSource",
    "FleetIndex",
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
    "Listing",
    "LogSettings",
    "LupineSettings",
    "Membership",
    "MembershipTiming",
    "Mirror",
    "NotFound",
    "ObjectChange",
    "ObjectRef",
    "PayloadTooLarge",
    "PeerSettings",
    "PodCreations",
    "Poll",
    "Published",
    "Readiness",
    "Reflector",
    "ReflectorTiming",
    "ResourceSettings",
    "RgpuError",
    "SchedulingSettings",
    "ServiceLifespan",
    "Settings",
    "SettingsError",
    "Standing",
    "TokenBucket",
    "TokenRequestSource",
    "TokenSource",
    "TraceSettings",
    "Unauthorized",
    "Unavailable",
    "Update",
    "UpstreamError",
    "VerdictCache",
    "Versioned",
    "WatchEvent",
    "WatchTrouble",
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
    "creation_context",
    "creation_of",
    "decode_json",
    "default_listeners",
    "event_body",
    "gzip_body",
    "http_client",
    "initial_revision",
    "instrument_app",
    "json_response",
    "kube_client",
    "kube_pages",
    "link_creation",
    "member_lease_name",
    "object_key",
    "pod_attributes",
    "pod_span",
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
    "trace_exemplar",
    "trace_sampler",
    "traceparent_of",
    "tracer",
    "upstream_error",
]
