"""Settings read from the environment once, at start, and refused with the key that is wrong.

``Settings`` is what every service reads (listeners, the Kubernetes API, auth, logs, traces,
the scheduling policy the services share); a service with settings of its own subclasses it.
``KNOWN_KEYS`` is the union of every service's ``RGPU_*`` keys, since one ConfigMap
configures them all. ``Env`` and the ``parse_*`` readers (and ``bad_setting`` for a rule of its
own) are what a service's own settings read with, so its refusals name the key, the value and
the fix like every other.
"""

from __future__ import annotations

from ._env import Env
from ._keys import KNOWN_KEYS, OWN_KEYS, SHARED_KEYS
from ._listener_limits import ListenerLimits
from ._parse import HostPort
from ._parse import bad as bad_setting
from ._parse import byte_count as parse_byte_count
from ._parse import choice as parse_choice
from ._parse import csv as parse_list
from ._parse import dns_label as parse_dns_label
from ._parse import labels as parse_labels
from ._parse import port as parse_port
from ._parse import seconds as parse_seconds
from ._parse import word as parse_word
from ._settings import (
    DEFAULT_MAX_BODY_BYTES,
    AdmissionSettings,
    ResourceSettings,
    SchedulingSettings,
    Settings,
)
from ._traces import TraceSettings

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "KNOWN_KEYS",
    "OWN_KEYS",
    "SHARED_KEYS",
    "AdmissionSettings",
    "Env",
    "HostPort",
    "ListenerLimits",
    "ResourceSettings",
    "SchedulingSettings",
    "Settings",
    "TraceSettings",
    "bad_setting",
    "parse_byte_count",
    "parse_choice",
    "parse_dns_label",
    "parse_labels",
    "parse_list",
    "parse_port",
    "parse_seconds",
    "parse_word",
]
