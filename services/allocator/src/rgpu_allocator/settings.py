"""The allocator's own settings: how long a booking lives, when it preempts, what it does for
a lost server, how fast it admits, and whether it fences lupine servers with NetworkPolicy.

Only the allocator books, preempts, admits and writes server policies, so only it reads these
keys; they are in the runtime's ``KNOWN_KEYS`` all the same, so the other services sharing the
ConfigMap accept them. The scheduling and admission keys widen the shared groups of the same
name, so ``settings.scheduling`` holds every scheduling key the allocator reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Literal, cast

from rgpu_runtime.settings import (
    OWN_KEYS,
    AdmissionSettings,
    Env,
    SchedulingSettings,
    Settings,
    bad_setting,
    parse_choice,
    parse_dns_label,
    parse_labels,
    parse_seconds,
)

__all__ = [
    "KEYS",
    "AllocatorAdmission",
    "AllocatorScheduling",
    "AllocatorSettings",
    "OnServerLost",
    "ServerPolicySettings",
]

OnServerLost = Literal["keep", "evict"]

KEYS = OWN_KEYS["allocator"]
"""The keys only the allocator reads."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorScheduling(SchedulingSettings):
    """The shared placement policy, and how the allocator keeps, takes back and gives up
    bookings."""

    booking_ttl_seconds: float = 30.0
    """``RGPU_BOOKING_TTL_SECONDS``: seconds a booked, unbound claim survives; long enough for
    kube-scheduler's filter-to-bind gap, short enough that an abandoned booking frees fast."""
    preemption: bool = True
    """``RGPU_PREEMPTION``: ``on`` or ``off``; on, because kube-scheduler cannot evict a remote
    GPU's holder for an urgent pod (docs/design.md §11) and pods without a priority never
    preempt."""
    server_lost_grace_seconds: float = 60.0
    """``RGPU_SERVER_LOST_GRACE_SECONDS``: how long a held server may be unreachable or its
    Node NotReady before its holders are told (and, with ``evict``, evicted); a minute rides
    out a lupine restart or a kubelet hiccup, and is short next to a job stuck on a dead GPU."""
    on_server_lost: OnServerLost = "keep"
    """``RGPU_ON_SERVER_LOST``: ``keep`` (Warning Event and readiness gate only) or ``evict``
    (also evict the holders through the Eviction API, so their controllers run them
    elsewhere); keep, because evicting is the owner's call: a job may survive a short outage."""

    @classmethod
    def read(cls, env: Env, shared: SchedulingSettings) -> AllocatorScheduling:
        """``shared`` widened with the four booking keys; raises ``SettingsError`` on a bad one."""
        d = cls()
        pieces = {f.name: getattr(shared, f.name) for f in fields(SchedulingSettings)}
        return cls(
            **pieces,
            booking_ttl_seconds=env.read(
                "RGPU_BOOKING_TTL_SECONDS", parse_seconds, d.booking_ttl_seconds
            ),
            preemption=env.read("RGPU_PREEMPTION", _on_off, d.preemption),
            server_lost_grace_seconds=env.read(
                "RGPU_SERVER_LOST_GRACE_SECONDS", parse_seconds, d.server_lost_grace_seconds
            ),
            on_server_lost=env.read("RGPU_ON_SERVER_LOST", _on_server_lost, d.on_server_lost),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorAdmission(AdmissionSettings):
    """The shared admission mode, and how fast and how far ahead the allocator admits."""

    ttl_seconds: float = 60.0
    """``RGPU_ADMISSION_TTL_SECONDS``: seconds an admitted pod's booking survives unbound; it
    covers kube-scheduler's queue after the gate is lifted (seconds in a burst), and past it
    the booking lapses and the pod takes the filter path."""
    concurrency: int = 64
    """``RGPU_ADMISSION_CONCURRENCY``: admissions (booking plus gate removal) in flight at
    once; enough to keep the apiserver's write path busy in a burst, bounded so a burst of
    thousands does not open thousands of requests."""
    ahead: int = 256
    """``RGPU_ADMISSION_AHEAD``: admitted pods kube-scheduler has not bound yet, at most.
    Admitting further ahead of the scheduler gains nothing (it binds one pod per cycle) and
    lets bookings lapse in its queue: each such pod then costs a second cycle on the filter
    path. 256 within a 60 s TTL needs the scheduler to bind 4.3 pods/s; raise it with the
    TTL for a slower scheduler, or for one that binds far faster than 256 per TTL."""

    @classmethod
    def read(cls, env: Env, shared: AdmissionSettings) -> AllocatorAdmission:
        """``shared`` widened with the three pace keys; raises ``SettingsError`` on a bad one."""
        d = cls()
        return cls(
            mode=shared.mode,
            ttl_seconds=env.read("RGPU_ADMISSION_TTL_SECONDS", parse_seconds, d.ttl_seconds),
            concurrency=env.read("RGPU_ADMISSION_CONCURRENCY", _concurrency, d.concurrency),
            ahead=env.read("RGPU_ADMISSION_AHEAD", _ahead, d.ahead),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerPolicySettings:
    """Whether the allocator keeps one NetworkPolicy per lupine server (docs/security.md)."""

    enabled: bool = False
    """``RGPU_SERVER_POLICIES``: ``on`` (only a server's current holders, and discovery's
    probes, may reach its lupine port) or ``off``. Off, because it needs what rgpu cannot
    check from inside: lupine running as pods on the pod network, and a CNI that enforces
    NetworkPolicy, ``ipBlock`` on pod addresses included."""
    lupine_namespace: str = "rgpu-lupine"
    """``RGPU_LUPINE_NAMESPACE``: where the lupine server pods run, and so where their
    policies go; k8s/components/lupine-server's namespace."""
    lupine_labels: tuple[tuple[str, str], ...] = (("app.kubernetes.io/name", "lupine-server"),)
    """``RGPU_LUPINE_POD_LABELS``: ``key=value[,key=value]`` that every lupine server pod
    carries; the lupine-server DaemonSet's selector."""

    @classmethod
    def read(cls, env: Env) -> ServerPolicySettings:
        """Read and check the three keys; raises ``SettingsError`` naming a bad one."""
        d = cls()
        return cls(
            enabled=env.read("RGPU_SERVER_POLICIES", _on_off, d.enabled),
            lupine_namespace=env.read("RGPU_LUPINE_NAMESPACE", parse_dns_label, d.lupine_namespace),
            lupine_labels=env.read("RGPU_LUPINE_POD_LABELS", parse_labels, d.lupine_labels),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorSettings(Settings):
    """Every service's settings, and the allocator's own."""

    scheduling: AllocatorScheduling = field(default_factory=AllocatorScheduling)
    admission: AllocatorAdmission = field(default_factory=AllocatorAdmission)
    server_policies: ServerPolicySettings = field(default_factory=ServerPolicySettings)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, *, service: str = "allocator"
    ) -> AllocatorSettings:
        """Read and check every setting the allocator reads; raises ``SettingsError`` if bad."""
        shared = Settings.from_env(environ, service=service)
        pieces = {f.name: getattr(shared, f.name) for f in fields(Settings)}
        env = Env(environ)
        pieces["scheduling"] = AllocatorScheduling.read(env, shared.scheduling)
        pieces["admission"] = AllocatorAdmission.read(env, shared.admission)
        return cls(**pieces, server_policies=ServerPolicySettings.read(env))


def _on_off(key: str, value: str) -> bool:
    return parse_choice(key, value, ("on", "off")) == "on"


def _on_server_lost(key: str, value: str) -> OnServerLost:
    return cast(OnServerLost, parse_choice(key, value, ("keep", "evict")))


def _concurrency(key: str, value: str) -> int:
    return _whole(key, value, digits=4, most=1024)


def _ahead(key: str, value: str) -> int:
    return _whole(key, value, digits=5, most=10_000)


def _whole(key: str, value: str, *, digits: int, most: int) -> int:
    text = value.strip()
    if not text.isdigit() or len(text) > digits or not 1 <= int(text) <= most:
        raise bad_setting(key, value, f"expected a whole number from 1 to {most}")
    return int(text)
