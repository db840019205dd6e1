"""How many traces a service keeps: the standard OpenTelemetry sampler variables and rgpu's
share of background traces, read and checked at start like every other setting.

``telemetry`` turns them into a sampler; they live here so a service's settings can hold them
without the settings importing the tracing machinery.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import _parse as p

SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
"""The values of ``OTEL_TRACES_SAMPLER`` rgpu honours (the specification's built-in ones)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSettings:
    """How many traces are kept, read from the standard variables and one of rgpu's."""

    sampler: str = "parentbased_always_on"
    """``OTEL_TRACES_SAMPLER``: the specification's default; every request trace is sent, so a
    collector's tail sampling sees every error and every slow trace."""
    ratio: float = 1.0
    """``OTEL_TRACES_SAMPLER_ARG``: the share of request traces kept by ``traceidratio`` and
    ``parentbased_traceidratio`` (0..1); ignored by the other samplers, as specified."""
    background_ratio: float = 0.1
    """``RGPU_TRACE_BACKGROUND_RATIO``: the share of background traces kept (0..1); one in ten
    turns the ~10 background traces a second of 6 servers into one."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TraceSettings:
        """Read and check the three variables; raises ``SettingsError`` naming a bad one."""
        d = cls()
        text = environ.get("OTEL_TRACES_SAMPLER", "").strip()
        name = text.lower() or d.sampler
        if name not in SAMPLERS:
            raise p.bad("OTEL_TRACES_SAMPLER", text, f"expected one of {', '.join(SAMPLERS)}")
        return cls(
            sampler=name,
            ratio=_ratio(environ, "OTEL_TRACES_SAMPLER_ARG", d.ratio),
            background_ratio=_ratio(environ, "RGPU_TRACE_BACKGROUND_RATIO", d.background_ratio),
        )


def _ratio(environ: Mapping[str, str], key: str, default: float) -> float:
    text = environ.get(key, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise p.bad(key, text, "expected a share of traces between 0 and 1, e.g. 0.25")
    return value
