"""Settings read from the environment once, at start, and refused with the key that is wrong.

The pieces a service composes its own settings from, and the one list of ``RGPU_*`` keys that
every service accepts (one ConfigMap configures them all).
"""

from __future__ import annotations

from ._listener_limits import ListenerLimits
from ._parse import HostPort
from ._settings import DEFAULT_MAX_BODY_BYTES, ResourceSettings, Settings
from ._traces import TraceSettings

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "HostPort",
    "ListenerLimits",
    "ResourceSettings",
    "Settings",
    "TraceSettings",
]
