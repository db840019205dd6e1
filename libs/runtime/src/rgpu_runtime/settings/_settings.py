"""One ConfigMap configures every service, read once, checked at start.

``Settings.from_env(environ, service=...)`` turns the ``RGPU_*`` variables (docs/design.md §6) into
a frozen value grouped by concern. An empty value counts as unset (ConfigMaps often carry ``""``). A
bad value, or an ``RGPU_*`` key nobody knows (a typo would otherwise silently fall back to a
default), raises ``SettingsError`` naming the key, the value and what is expected.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Self, TypeVar, cast

from rgpu_runtime.errors import SettingsError

from . import _parse as p
from ._env import Env
from ._keys import refuse_unknown
from ._listener_limits import ListenerLimits, read_limits
from ._parse import HostPort
from ._traces import TraceSettings

Granularity = Literal["server", "card"]
LogFormat = Literal["json", "text"]
AuthMode = Literal["tokenreview", "none"]
AdmissionMode = Literal["gate", "filter"]
T = TypeVar("T")

SERVICES = ("discovery", "allocator", "extender", "metrics")

_DEFAULT_LISTEN = {
    "discovery": "127.0.0.1:8081",
    "allocator": "127.0.0.1:8082",
    "extender": "127.0.0.1:8083",
    "metrics": "127.0.0.1:9400",
}

DEFAULT_MAX_BODY_BYTES = 1 << 20
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceSettings:
    """Extended resource names pods request; HAMi's names by default for compatibility."""

    count: str = "nvidia.com/remote-gpu"
    """``RGPU_RESOURCE_COUNT``: cards per container; HAMi's remote-gpu name so pods move over."""
    memory: str = "nvidia.com/remote-gpu-memory"
    """``RGPU_RESOURCE_MEMORY``: MiB per card a container needs; HAMi's name, same reason."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulingSettings:
    """Placement policy shared by the allocator, extender and webhook.

    A service that reads scheduling keys of its own subclasses this (the allocator's booking
    TTL, preemption and lost servers; the extender's webhook image, trusted users and budget).
    """

    granularity: Granularity = "server"
    """``RGPU_GRANULARITY``: ``server`` (a pod gets a whole server; lupine shows clients every
    GPU of it, so this is the safe isolation unit) or ``card`` (trusted tenants only)."""
    scheduler_name: str = "rgpu-scheduler"
    """``RGPU_SCHEDULER_NAME``: the second scheduler the webhook assigns GPU pods to."""
    namespace: str = "rgpu-system"
    """``RGPU_NAMESPACE``: where claim Leases live; rgpu's own namespace so RBAC stays narrow."""
    topology_keys: tuple[str, ...] = (
        "topology.rgpu.io/rack",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
    )
    """``RGPU_TOPOLOGY_KEYS``: node labels for locality, finest first; rack before zone before
    region because a closer GPU is a faster GPU."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionSettings:
    """Whether rgpu admits GPU pods itself, behind a scheduling gate, before kube-scheduler.

    The webhook gates and the allocator admits, so both read the mode; how fast and how far
    ahead the allocator admits is the allocator's own (its ``AllocatorAdmission``).
    """

    mode: AdmissionMode = "gate"
    """``RGPU_ADMISSION``: ``gate`` (the webhook gates every GPU pod with ``rgpu.io/admission``;
    the elected allocator books a server, then lifts the gate, so kube-scheduler's serial cycle
    only reads the booking) or ``filter`` (HAMi's flow: the booking is made inside
    kube-scheduler's ``/filter``). Gate by default: a burst is admitted at the apiserver's
    write rate instead of one pod per scheduler cycle, and waiting pods cost nothing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerSettings:
    """Where the services find each other."""

    discovery_url: str = "http://127.0.0.1:8081"
    """``RGPU_DISCOVERY_URL``: discovery's base URL; its default listen address."""
    allocator_url: str = "http://127.0.0.1:8082"
    """``RGPU_ALLOCATOR_URL``: allocator's base URL; its default listen address."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeSettings:
    """How to reach the Kubernetes API (see ``kube_client``)."""

    url: str | None = None
    """``RGPU_KUBE_URL``: explicit apiserver URL (the simulated cluster); unset means in-cluster
    config, then kubeconfig, as any Kubernetes controller does."""
    kubeconfig: str | None = None
    """``KUBECONFIG``: kubeconfig path(s) for out-of-cluster runs; unset means ~/.kube/config."""
    service_host: str | None = None
    """``KUBERNETES_SERVICE_HOST``: set in every pod by the kubelet; present means in-cluster."""
    service_port: str | None = None
    """``KUBERNETES_SERVICE_PORT``: the apiserver port that goes with ``service_host``."""
    pod_namespace: str | None = None
    """``POD_NAMESPACE``: this pod's namespace (downward API) when present, for events and ids."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpSettings:
    """Where this process listens, and what a request may hold on every listener."""

    listen: HostPort
    """``RGPU_LISTEN``: this service's address; loopback by default so nothing is exposed by
    accident (discovery :8081, allocator :8082, extender :8083, metrics :9400)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """``RGPU_MAX_BODY_BYTES``: the request body limit of routes that do not set their own;
    1 MiB holds our largest ordinary body (an ExtenderArgs with node names only, as
    ``nodeCacheCapable`` sends) with room, and bounds memory per request. Raise it when
    kube-scheduler sends full Nodes to the extender."""
    limits: ListenerLimits = field(default_factory=ListenerLimits)
    """``RGPU_HTTP_*``: what one client may hold on each of this process's listeners."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthSettings:
    """How services prove who they are to each other (docs/design.md §10)."""

    mode: AuthMode = "tokenreview"
    """``RGPU_AUTH``: ``tokenreview`` (guarded routes require a ServiceAccount token with the
    receiving service's audience, ``rgpu-<service>``, that TokenReview confirms) or ``none``
    (any caller; an explicit choice, logged as a warning at start). Secure by default."""
    allocation_callers: tuple[str, ...] = ()
    """``RGPU_ALLOCATION_CALLERS``: exact usernames (``system:serviceaccount:<ns>:<name>``) that
    may book, commit and release at the allocator (the extender's); empty so nobody is trusted
    unless listed. No wildcards."""
    probe_callers: tuple[str, ...] = ()
    """``RGPU_PROBE_CALLERS``: exact usernames that may ask discovery for a probe (the
    allocator's); empty so nobody is trusted unless listed. No wildcards."""
    cache_seconds: float = 60.0
    """``RGPU_AUTH_CACHE_SECONDS``: how long a TokenReview verdict is reused; a minute keeps the
    apiserver off the booking path yet lets a deleted account lose access quickly (never
    longer than the token's own expiry)."""
    token_dir: str = "/var/run/secrets/rgpu"
    """``RGPU_TOKEN_DIR``: where a caller finds its projected tokens, one file per audience it
    calls (``rgpu-allocator``, ``rgpu-discovery``), re-read as the kubelet rotates them. Where
    the k8s/ Deployments mount them."""
    token_account: str | None = None
    """``RGPU_TOKEN_ACCOUNT``: a service-account name in ``RGPU_NAMESPACE`` to mint tokens for
    through TokenRequest instead of reading ``token_dir``; for the simulated cluster, where
    no kubelet projects tokens. Unset in a real cluster."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    """How the process logs."""

    level: str = "INFO"
    """``RGPU_LOG_LEVEL``: DEBUG, INFO, WARNING, ERROR or CRITICAL; INFO logs decisions, not
    every request."""
    format: LogFormat = "json"
    """``RGPU_LOG_FORMAT``: ``json`` (one object per line, for log pipelines) or ``text``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What every service reads from its environment, once, at start.

    Only what more than one service reads is here. A service with settings of its own
    subclasses this and adds them (discovery's ``DiscoverySettings`` adds how lupine servers are
    probed; the allocator's ``AllocatorSettings`` widens ``scheduling`` and ``admission`` with
    the keys only it reads); ``run_service`` is given that class. ``KNOWN_KEYS`` still lists
    every service's keys, because one ConfigMap configures them all: a key another service
    reads is accepted here, and only its reader checks it.
    """

    service: str
    """Which service this process runs (discovery, allocator, extender, metrics)."""
    http: HttpSettings
    resources: ResourceSettings = field(default_factory=ResourceSettings)
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    peers: PeerSettings = field(default_factory=PeerSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    log: LogSettings = field(default_factory=LogSettings)
    traces: TraceSettings = field(default_factory=TraceSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, *, service: str) -> Self:
        """Read and check every setting; raises ``SettingsError`` on the first bad one."""
        if service not in SERVICES:
            raise SettingsError(f"service={service!r}: expected one of {', '.join(SERVICES)}")
        env = Env(environ)
        refuse_unknown(environ)
        return cls(
            service=service,
            http=_http(env, service),
            resources=_resources(env),
            scheduling=_scheduling(env),
            admission=_admission(env),
            peers=_peers(env),
            kube=_kube(env),
            auth=_auth(env),
            log=_log(env),
            traces=TraceSettings.from_env(environ),
        )


def _resources(env: Env) -> ResourceSettings:
    d = ResourceSettings()
    count = env.get("RGPU_RESOURCE_COUNT")
    memory = env.get("RGPU_RESOURCE_MEMORY")
    return ResourceSettings(
        count=d.count if count is None else p.label_key("RGPU_RESOURCE_COUNT", count, count),
        memory=d.memory if memory is None else p.label_key("RGPU_RESOURCE_MEMORY", memory, memory),
    )


def _scheduling(env: Env) -> SchedulingSettings:
    d = SchedulingSettings()
    granularity = env.get("RGPU_GRANULARITY")
    return SchedulingSettings(
        granularity=d.granularity
        if granularity is None
        else cast(Granularity, p.choice("RGPU_GRANULARITY", granularity, ("server", "card"))),
        scheduler_name=_read(env, "RGPU_SCHEDULER_NAME", p.word, d.scheduler_name),
        namespace=_read(env, "RGPU_NAMESPACE", p.dns_label, d.namespace),
        topology_keys=_read(env, "RGPU_TOPOLOGY_KEYS", p.label_keys, d.topology_keys),
    )


def _admission(env: Env) -> AdmissionSettings:
    d = AdmissionSettings()
    mode = env.get("RGPU_ADMISSION")
    return AdmissionSettings(
        mode=d.mode
        if mode is None
        else cast(AdmissionMode, p.choice("RGPU_ADMISSION", mode, ("gate", "filter"))),
    )


def _peers(env: Env) -> PeerSettings:
    d = PeerSettings()
    return PeerSettings(
        discovery_url=_read(env, "RGPU_DISCOVERY_URL", p.url, d.discovery_url),
        allocator_url=_read(env, "RGPU_ALLOCATOR_URL", p.url, d.allocator_url),
    )


def _kube(env: Env) -> KubeSettings:
    return KubeSettings(
        url=_read(env, "RGPU_KUBE_URL", p.url, None),
        kubeconfig=env.get("KUBECONFIG"),
        service_host=env.get("KUBERNETES_SERVICE_HOST"),
        service_port=env.get("KUBERNETES_SERVICE_PORT"),
        pod_namespace=_read(env, "POD_NAMESPACE", p.dns_label, None),
    )


def _http(env: Env, service: str) -> HttpSettings:
    return HttpSettings(
        listen=_address(env, "RGPU_LISTEN", _DEFAULT_LISTEN[service]),
        max_body_bytes=_read(env, "RGPU_MAX_BODY_BYTES", p.byte_count, DEFAULT_MAX_BODY_BYTES),
        limits=read_limits(env.get),
    )


def _auth(env: Env) -> AuthSettings:
    d = AuthSettings()
    mode = env.get("RGPU_AUTH")
    return AuthSettings(
        mode=d.mode
        if mode is None
        else cast(AuthMode, p.choice("RGPU_AUTH", mode, ("tokenreview", "none"))),
        allocation_callers=_read(env, "RGPU_ALLOCATION_CALLERS", _usernames, d.allocation_callers),
        probe_callers=_read(env, "RGPU_PROBE_CALLERS", _usernames, d.probe_callers),
        cache_seconds=_read(env, "RGPU_AUTH_CACHE_SECONDS", p.seconds, d.cache_seconds),
        token_dir=_read(env, "RGPU_TOKEN_DIR", p.word, d.token_dir),
        token_account=_read(env, "RGPU_TOKEN_ACCOUNT", _account_name, None),
    )


def _account_name(key: str, value: str) -> str:
    text = value.strip()
    if len(text) > 253 or not _DNS_SUBDOMAIN.fullmatch(text):
        raise p.bad(key, value, "expected a service-account name (a DNS-1123 subdomain)")
    return text


def _usernames(key: str, value: str) -> tuple[str, ...]:
    names = p.csv(value)
    for name in names:
        if "*" in name or any(c.isspace() for c in name):
            raise p.bad(
                key,
                value,
                f"{name!r}: list exact usernames, e.g. "
                "system:serviceaccount:rgpu-system:rgpu-extender (no wildcards or spaces)",
            )
    return names


def _address(env: Env, key: str, default: str) -> HostPort:
    return HostPort.parse((env.get(key) or default).strip(), key=key)


def _log(env: Env) -> LogSettings:
    d = LogSettings()
    level = env.get("RGPU_LOG_LEVEL")
    if level is not None and level.strip().upper() == "WARN":
        level = "WARNING"
    fmt = env.get("RGPU_LOG_FORMAT")
    return LogSettings(
        level=d.level if level is None else p.choice("RGPU_LOG_LEVEL", level, _LOG_LEVELS),
        format=d.format
        if fmt is None
        else cast(LogFormat, p.choice("RGPU_LOG_FORMAT", fmt, ("json", "text"))),
    )


def _read(env: Env, key: str, parse: Callable[[str, str], T], default: T) -> T:
    return env.read(key, parse, default)
