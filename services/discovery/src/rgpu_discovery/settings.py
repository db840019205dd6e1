"""Discovery's own settings: how lupine servers are reached and probed.

Only discovery probes lupine, so only discovery reads these keys; they are in the runtime's
``KNOWN_KEYS`` all the same, so the other services sharing the ConfigMap accept them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from rgpu_runtime.settings import OWN_KEYS, Env, Settings, parse_port, parse_seconds

__all__ = ["KEYS", "DiscoverySettings", "LupineSettings"]

KEYS = OWN_KEYS["discovery"]
"""The keys only discovery reads."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LupineSettings:
    """How servers are reached and probed."""

    default_port: int = 14833
    """``RGPU_DEFAULT_PORT``: lupine port when the server label has none; lupine's own default."""
    probe_interval_seconds: float = 15.0
    """``RGPU_PROBE_INTERVAL_SECONDS``: seconds between probes; a dead server is noticed within
    one scrape interval of Prometheus' usual 15 s, at one cheap GET per server."""
    probe_timeout_seconds: float = 2.0
    """``RGPU_PROBE_TIMEOUT_SECONDS``: seconds a probe may take; a healthy lupine answers in ms,
    and HAMi uses 2 s."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> LupineSettings:
        """Read and check the three keys; raises ``SettingsError`` naming a bad one."""
        env, d = Env(environ), cls()
        return cls(
            default_port=env.read("RGPU_DEFAULT_PORT", parse_port, d.default_port),
            probe_interval_seconds=env.read(
                "RGPU_PROBE_INTERVAL_SECONDS", parse_seconds, d.probe_interval_seconds
            ),
            probe_timeout_seconds=env.read(
                "RGPU_PROBE_TIMEOUT_SECONDS", parse_seconds, d.probe_timeout_seconds
            ),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoverySettings(Settings):
    """Every service's settings, and discovery's own."""

    lupine: LupineSettings = field(default_factory=LupineSettings)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, *, service: str = "discovery"
    ) -> DiscoverySettings:
        """Read and check every setting discovery uses; raises ``SettingsError`` on a bad one."""
        shared = Settings.from_env(environ, service=service)
        pieces = {f.name: getattr(shared, f.name) for f in fields(Settings)}
        return cls(**pieces, lupine=LupineSettings.from_env(environ))
