"""What one listener lets a client hold, read from ``RGPU_HTTP_*``.

Bodies are bounded per route; everything before a body is bounded per listener, as nginx,
envoy and Go's ``net/http`` bound it: the bytes of a request's head, the time it may take to
arrive, how long an idle kept-alive connection stays open, and how many connections the
listener and each client address may have open at once. The defaults admit every honest
caller of rgpu's services with room to spare (an apiserver calling the webhook with a few
hundred connections at once, clients that pool theirs) and nothing that holds a service's
memory or CPU hostage. ``serving`` enforces them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import _parse as p

HEADER_BYTES_CEILING = 1 << 20
"""The most ``RGPU_HTTP_MAX_HEADER_BYTES`` may be (Go's default ``MaxHeaderBytes``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerLimits:
    """The limits every listener of a service applies, read from ``RGPU_HTTP_*``."""

    max_header_bytes: int = 64 << 10
    """``RGPU_HTTP_MAX_HEADER_BYTES``: a request's line and headers together; beyond it the
    answer is 431 and the connection closes. 64 KiB: our largest honest head carries a
    projected token of about 1 KiB; nginx allows 32 KiB, Go 1 MiB."""
    header_seconds: float = 10.0
    """``RGPU_HTTP_HEADER_SECONDS``: time from accepting a connection (or from the first byte
    of a kept-alive connection's next request) until its head, TLS handshake included, is
    complete; then 408 and close. Go's ``ReadHeaderTimeout`` and nginx's 60 s
    ``client_header_timeout`` serve the same end; honest heads arrive in milliseconds."""
    idle_seconds: float = 120.0
    """``RGPU_HTTP_IDLE_SECONDS``: how long a kept-alive connection may sit between requests.
    Longer than the idle timeouts of our callers' pools (Go's 90 s in the apiserver's webhook
    client, 30 s in ours), so the client closes first and never sends on a connection the
    server is closing."""
    max_connections: int = 1024
    """``RGPU_HTTP_MAX_CONNECTIONS``: connections one listener keeps open at once (TLS
    handshakes included); a connection beyond it is closed as soon as it is accepted."""
    max_client_connections: int = 256
    """``RGPU_HTTP_MAX_CLIENT_CONNECTIONS``: connections one client address keeps open on one
    listener; beyond it, closed at once. Room for an apiserver's burst of webhook calls, while
    four abusive addresses are needed to fill a listener."""


LIMIT_KEYS = (
    "RGPU_HTTP_HEADER_SECONDS",
    "RGPU_HTTP_IDLE_SECONDS",
    "RGPU_HTTP_MAX_CLIENT_CONNECTIONS",
    "RGPU_HTTP_MAX_CONNECTIONS",
    "RGPU_HTTP_MAX_HEADER_BYTES",
)
_MAX_CONNECTIONS_CEILING = 1 << 20


def read_limits(get: Callable[[str], str | None]) -> ListenerLimits:
    """The ``RGPU_HTTP_*`` settings (``get`` answers None for an unset key)."""
    d = ListenerLimits()

    def read(key: str, parse: Callable[[str, str], float], default: float) -> float:
        value = get(key)
        return default if value is None else parse(key, value)

    limits = ListenerLimits(
        max_header_bytes=int(read("RGPU_HTTP_MAX_HEADER_BYTES", _header_bytes, d.max_header_bytes)),
        header_seconds=read("RGPU_HTTP_HEADER_SECONDS", p.seconds, d.header_seconds),
        idle_seconds=read("RGPU_HTTP_IDLE_SECONDS", p.seconds, d.idle_seconds),
        max_connections=int(read("RGPU_HTTP_MAX_CONNECTIONS", _count, d.max_connections)),
        max_client_connections=int(
            read("RGPU_HTTP_MAX_CLIENT_CONNECTIONS", _count, d.max_client_connections)
        ),
    )
    if limits.max_client_connections > limits.max_connections:
        raise p.bad(
            "RGPU_HTTP_MAX_CLIENT_CONNECTIONS",
            str(limits.max_client_connections),
            f"expected at most RGPU_HTTP_MAX_CONNECTIONS ({limits.max_connections})",
        )
    return limits


def _whole(key: str, value: str, low: int, high: int, what: str) -> int:
    text = value.strip()
    # Digits are counted before int(): a value of thousands of digits is refused, not converted.
    if not text.isdigit() or len(text) > len(str(high)) or not low <= int(text) <= high:
        raise p.bad(key, value, f"expected a whole number of {what}, {low}..{high}")
    return int(text)


def _header_bytes(key: str, value: str) -> int:
    return _whole(key, value, 1024, HEADER_BYTES_CEILING, "bytes")


def _count(key: str, value: str) -> int:
    return _whole(key, value, 1, _MAX_CONNECTIONS_CEILING, "connections")
