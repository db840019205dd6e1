"""The extender's own settings: its two listeners (kube-scheduler's and the apiserver's TLS
webhook), how each is secured, and what the webhook injects and trusts.

Only the extender serves kube-scheduler and the webhook, so only it reads these keys; they are
in the runtime's ``KNOWN_KEYS`` all the same, so the other services sharing the ConfigMap
accept them. Its scheduling keys widen the shared group of that name, so
``settings.scheduling`` holds every scheduling key the extender reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from rgpu_runtime.errors import SettingsError
from rgpu_runtime.settings import (
    OWN_KEYS,
    Env,
    HostPort,
    SchedulingSettings,
    Settings,
    parse_byte_count,
    parse_list,
    parse_seconds,
    parse_word,
)

__all__ = ["KEYS", "EdgeSettings", "ExtenderScheduling", "ExtenderSettings"]

KEYS = OWN_KEYS["extender"]
"""The keys only the extender reads."""

_SCHEDULER_MAX_BODY_BYTES = 4 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeSettings:
    """The webhook listener, TLS, client certificates and kube-scheduler's body limit."""

    webhook_listen: HostPort = field(default_factory=lambda: HostPort(host="127.0.0.1", port=8443))
    """``RGPU_WEBHOOK_LISTEN``: the extender's TLS webhook; 8443, the usual webhook port."""
    tls_cert_file: str | None = None
    """``RGPU_TLS_CERT_FILE``: PEM certificate for the webhook; unset means no TLS listener."""
    tls_key_file: str | None = None
    """``RGPU_TLS_KEY_FILE``: PEM key for ``tls_cert_file``; set both or neither."""
    scheduler_client_ca_file: str | None = None
    """``RGPU_SCHEDULER_CLIENT_CA_FILE``: PEM CA bundle; when set the scheduler listener serves
    TLS with ``tls_cert_file``/``tls_key_file`` and requires a client certificate signed by it
    (kube-scheduler's extender ``tlsConfig``). Unset means plain HTTP and no client certificate
    (only the NetworkPolicy keeps other pods off the port)."""
    webhook_client_ca_file: str | None = None
    """``RGPU_WEBHOOK_CLIENT_CA_FILE``: PEM CA bundle; when set the webhook listener answers
    ``/mutate`` only to a caller presenting a client certificate signed by it (the apiserver,
    given one through its AdmissionConfiguration); health stays open for the kubelet. Unset
    means any caller that reaches the port may send reviews."""
    scheduler_max_body_bytes: int = _SCHEDULER_MAX_BODY_BYTES
    """``RGPU_SCHEDULER_MAX_BODY_BYTES``: largest ``/filter``, ``/prioritize`` or ``/bind`` body;
    4 MiB holds a pod at etcd's 1.5 MiB object limit plus thousands of ``NodeNames``
    (``nodeCacheCapable: true``); raise it when kube-scheduler sends full Nodes."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> EdgeSettings:
        """Read and check the six keys; raises ``SettingsError`` naming a bad one."""
        env = Env(environ)
        cert, key = _pair(env)
        return cls(
            webhook_listen=HostPort.parse(
                (env.get("RGPU_WEBHOOK_LISTEN") or "127.0.0.1:8443").strip(),
                key="RGPU_WEBHOOK_LISTEN",
            ),
            tls_cert_file=cert,
            tls_key_file=key,
            scheduler_client_ca_file=_client_ca(
                env, "RGPU_SCHEDULER_CLIENT_CA_FILE", cert, "scheduler"
            ),
            webhook_client_ca_file=_client_ca(env, "RGPU_WEBHOOK_CLIENT_CA_FILE", cert, "webhook"),
            scheduler_max_body_bytes=env.read(
                "RGPU_SCHEDULER_MAX_BODY_BYTES", parse_byte_count, _SCHEDULER_MAX_BODY_BYTES
            ),
        )


def _pair(env: Env) -> tuple[str | None, str | None]:
    cert = env.get("RGPU_TLS_CERT_FILE")
    key = env.get("RGPU_TLS_KEY_FILE")
    if (cert is None) != (key is None):
        given, missing = ("RGPU_TLS_CERT_FILE", "RGPU_TLS_KEY_FILE")[:: 1 if cert else -1]
        raise SettingsError(f"{given} is set but {missing} is not: set both or neither")
    return (cert.strip() if cert else None), (key.strip() if key else None)


def _client_ca(env: Env, key: str, cert: str | None, listener: str) -> str | None:
    bundle = env.read(key, parse_word, None)
    if bundle is not None and cert is None:
        raise SettingsError(
            f"{key}={bundle!r} asks the {listener} listener for client certificates, which "
            "needs TLS: set RGPU_TLS_CERT_FILE and RGPU_TLS_KEY_FILE too"
        )
    return bundle


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtenderScheduling(SchedulingSettings):
    """The shared placement policy, and what the webhook injects and trusts and how long a
    scheduler call may take."""

    lib_image: str | None = None
    """``RGPU_LIB_IMAGE``: HAMi-core library image the webhook injects; unset (off) because
    memory limits inside the client are optional."""
    trusted_users: tuple[str, ...] = ()
    """``RGPU_TRUSTED_USERS``: the exact usernames allowed to change scheduler-owned annotations
    and lift rgpu's scheduling gate, rgpu's own service accounts included (nothing is trusted
    implicitly); empty so nobody can forge an allocation unless listed."""
    extender_budget_seconds: float = 4.0
    """``RGPU_EXTENDER_BUDGET_SECONDS``: seconds the extender may spend per call; below
    kube-scheduler's default 5 s extender timeout so we answer with an error, not a timeout."""

    @classmethod
    def read(cls, env: Env, shared: SchedulingSettings) -> ExtenderScheduling:
        """``shared`` widened with the three extender keys; raises ``SettingsError`` if bad."""
        d = cls()
        pieces = {f.name: getattr(shared, f.name) for f in fields(SchedulingSettings)}
        return cls(
            **pieces,
            lib_image=env.read("RGPU_LIB_IMAGE", parse_word, None),
            trusted_users=env.read("RGPU_TRUSTED_USERS", _names, d.trusted_users),
            extender_budget_seconds=env.read(
                "RGPU_EXTENDER_BUDGET_SECONDS", parse_seconds, d.extender_budget_seconds
            ),
        )


def _names(key: str, value: str) -> tuple[str, ...]:
    return parse_list(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtenderSettings(Settings):
    """Every service's settings, and the extender's own."""

    scheduling: ExtenderScheduling = field(default_factory=ExtenderScheduling)
    edge: EdgeSettings = field(default_factory=EdgeSettings)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, *, service: str = "extender"
    ) -> ExtenderSettings:
        """Read and check every setting the extender uses; raises ``SettingsError`` on a bad one."""
        shared = Settings.from_env(environ, service=service)
        pieces = {f.name: getattr(shared, f.name) for f in fields(Settings)}
        pieces["scheduling"] = ExtenderScheduling.read(Env(environ), shared.scheduling)
        return cls(**pieces, edge=EdgeSettings.from_env(environ))
