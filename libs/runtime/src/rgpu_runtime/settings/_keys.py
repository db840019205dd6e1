"""Which ``RGPU_*`` keys exist: every service's, since one ConfigMap configures them all.

A key no service reads is a typo that would otherwise fall back to a default without a sound,
so it stops the service, with the closest known key; a key an older release read names what
replaced it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from rgpu_runtime.errors import SettingsError

from ._listener_limits import LIMIT_KEYS

__all__ = ["KNOWN_KEYS", "OWN_KEYS", "RETIRED_KEYS", "SHARED_KEYS", "refuse_unknown"]

SHARED_KEYS = (
    "RGPU_ADMISSION",
    "RGPU_ALLOCATION_CALLERS",
    "RGPU_ALLOCATOR_URL",
    "RGPU_AUTH",
    "RGPU_AUTH_CACHE_SECONDS",
    "RGPU_DISCOVERY_URL",
    "RGPU_GRANULARITY",
    *LIMIT_KEYS,
    "RGPU_KUBE_URL",
    "RGPU_LISTEN",
    "RGPU_LOG_FORMAT",
    "RGPU_LOG_LEVEL",
    "RGPU_MAX_BODY_BYTES",
    "RGPU_NAMESPACE",
    "RGPU_PROBE_CALLERS",
    "RGPU_RESOURCE_COUNT",
    "RGPU_RESOURCE_MEMORY",
    "RGPU_SCHEDULER_NAME",
    "RGPU_TOKEN_ACCOUNT",
    "RGPU_TOKEN_DIR",
    "RGPU_TOPOLOGY_KEYS",
    "RGPU_TRACE_BACKGROUND_RATIO",
)
"""The keys ``Settings`` reads: those more than one service needs."""

OWN_KEYS = {
    "discovery": (
        "RGPU_DEFAULT_PORT",
        "RGPU_PROBE_INTERVAL_SECONDS",
        "RGPU_PROBE_TIMEOUT_SECONDS",
    ),
    "allocator": (
        "RGPU_ADMISSION_AHEAD",
        "RGPU_ADMISSION_CONCURRENCY",
        "RGPU_ADMISSION_TTL_SECONDS",
        "RGPU_BOOKING_TTL_SECONDS",
        "RGPU_LUPINE_NAMESPACE",
        "RGPU_LUPINE_POD_LABELS",
        "RGPU_ON_SERVER_LOST",
        "RGPU_PREEMPTION",
        "RGPU_SERVER_LOST_GRACE_SECONDS",
        "RGPU_SERVER_POLICIES",
    ),
    "extender": (
        "RGPU_EXTENDER_BUDGET_SECONDS",
        "RGPU_LIB_IMAGE",
        "RGPU_SCHEDULER_CLIENT_CA_FILE",
        "RGPU_SCHEDULER_MAX_BODY_BYTES",
        "RGPU_TLS_CERT_FILE",
        "RGPU_TLS_KEY_FILE",
        "RGPU_TRUSTED_USERS",
        "RGPU_WEBHOOK_CLIENT_CA_FILE",
        "RGPU_WEBHOOK_LISTEN",
    ),
}
"""The keys only one service reads, by service: each declares them beside its own settings
class (its ``settings.KEYS``), and a test holds the two lists equal. They are listed here too
because the runtime cannot import the services, yet must know every key to refuse a typo."""

# The union: one ConfigMap configures every service, so a key is refused as unknown only when
# no service reads it.
KNOWN_KEYS = tuple(sorted({*SHARED_KEYS, *(key for keys in OWN_KEYS.values() for key in keys)}))

RETIRED_KEYS = {
    "RGPU_ALLOWED_CALLERS": (
        "one allow-list for every guarded route is gone: list the extender's account in "
        "RGPU_ALLOCATION_CALLERS (the allocator's writes) and the allocator's in "
        "RGPU_PROBE_CALLERS (discovery's probe)"
    ),
    "RGPU_TOKEN_FILE": (
        "each caller now reads one token per audience it calls from RGPU_TOKEN_DIR "
        "(<dir>/rgpu-allocator, <dir>/rgpu-discovery): project them there"
    ),
}
"""Keys an older ConfigMap may still carry, with what replaced them."""


def refuse_unknown(environ: Mapping[str, str]) -> None:
    """Raise ``SettingsError`` for the first ``RGPU_*`` key of ``environ`` no service reads."""
    for key in sorted(environ):
        if key in RETIRED_KEYS:
            raise SettingsError(f"{key}: no longer read; {RETIRED_KEYS[key]}")
        if key.startswith("RGPU_") and key not in KNOWN_KEYS:
            close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise SettingsError(
                f"{key}: unknown setting; {hint}known keys are {', '.join(KNOWN_KEYS)}"
            )
