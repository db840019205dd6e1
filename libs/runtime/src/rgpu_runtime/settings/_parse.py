"""Each kind of setting value is read and refused in one place.

Every reader takes the key and its raw text and returns a typed value or raises
``SettingsError`` whose message is ``KEY='value': expected ...`` — the key, the value and the
fix, so a typo in a ConfigMap stops the service with a line an operator can act on.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from rgpu_runtime.errors import SettingsError

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostPort:
    """A listen or peer address; ``str()`` gives ``host:port`` with IPv6 in brackets."""

    host: str
    """Interface or host name; an IPv6 literal is stored without brackets."""
    port: int
    """TCP port; 0 asks the kernel for a free one (tests, demos)."""

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def parse(cls, text: str, *, key: str = "address") -> HostPort:
        """Read ``host:port`` or ``[v6]:port``; an empty host means every interface."""
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise bad(key, text, "expected host:port, e.g. 127.0.0.1:8080 or [::1]:8080")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            raise bad(key, text, "expected an IPv6 host in brackets, e.g. [::1]:8080")
        if any(c.isspace() for c in host) or "[" in host or "]" in host:
            raise bad(key, text, "expected host:port with a plain host name or IP address")
        port = _port_number(key, text, port_text, minimum=0)
        return cls(host=host or "0.0.0.0", port=port)


def bad(key: str, value: str, expected: str) -> SettingsError:
    """Build the one message shape every settings failure uses."""
    return SettingsError(f"{key}={value!r}: {expected}")


def _port_number(key: str, value: str, text: str, *, minimum: int) -> int:
    expected = f"expected a port number {minimum}..65535"
    if not text.isdigit():
        raise bad(key, value, expected)
    port = int(text)
    if not minimum <= port <= 65535:
        raise bad(key, value, expected)
    return port


def port(key: str, value: str) -> int:
    """Read a TCP port 1..65535."""
    return _port_number(key, value, value.strip(), minimum=1)


def seconds(key: str, value: str) -> float:
    """Read a positive, finite number of seconds (``2``, ``0.5``)."""
    expected = "expected a positive number of seconds"
    try:
        number = float(value)
    except ValueError:
        raise bad(key, value, expected) from None
    if not math.isfinite(number) or number <= 0:
        raise bad(key, value, expected)
    return number


def choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    """Read one of ``allowed`` (case-insensitive), returned as spelled in ``allowed``."""
    for option in allowed:
        if value.strip().lower() == option.lower():
            return option
    raise bad(key, value, f"expected one of {', '.join(allowed)}")


def url(key: str, value: str) -> str:
    """Read an absolute http(s) URL and drop a trailing slash."""
    expected = "expected an absolute http:// or https:// URL, e.g. http://127.0.0.1:8081"
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018  (urlsplit checks the port lazily; a bad one raises here)
    except ValueError:
        raise bad(key, value, expected) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad(key, value, expected)
    return value.strip().rstrip("/")


def csv(value: str) -> tuple[str, ...]:
    """Split a comma list, trimming blanks and dropping empty items and repeats."""
    items = (item.strip() for item in value.split(","))
    return tuple(dict.fromkeys(item for item in items if item))


def label_key(key: str, value: str, item: str) -> str:
    """Check one Kubernetes qualified name (``[prefix/]name``), as labels and resources use."""
    expected = f"{item!r} is not a Kubernetes qualified name like example.com/name"
    prefix, _, name = item.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise bad(key, value, expected)
    if not _LABEL_NAME.fullmatch(name):
        raise bad(key, value, expected)
    return item


def label_keys(key: str, value: str) -> tuple[str, ...]:
    """Read a non-empty comma list of qualified names."""
    keys = csv(value)
    if not keys:
        raise bad(key, value, "expected a comma-separated list of label keys")
    return tuple(label_key(key, value, item) for item in keys)


def labels(key: str, value: str) -> tuple[tuple[str, str], ...]:
    """Read a non-empty comma list of ``key=value`` labels (an equality label selector)."""
    pairs = []
    for item in csv(value):
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not _LABEL_NAME.fullmatch(text):
            raise bad(key, value, f"{item!r} is not key=value with a label value (a-z, 0-9, -_.)")
        pairs.append((label_key(key, value, name), text))
    if not pairs:
        raise bad(
            key, value, "expected key=value labels, e.g. app.kubernetes.io/name=lupine-server"
        )
    return tuple(pairs)


def dns_label(key: str, value: str) -> str:
    """Read a DNS-1123 label (namespaces): lowercase, digits and '-', at most 63 characters."""
    text = value.strip()
    if not _DNS_LABEL.fullmatch(text):
        raise bad(key, value, "expected a DNS-1123 label (a-z, 0-9, '-', at most 63 characters)")
    return text


def word(key: str, value: str) -> str:
    """Read a single token without whitespace (names, images)."""
    text = value.strip()
    if any(c.isspace() for c in text):
        raise bad(key, value, "expected a single word without spaces")
    return text


_MAX_BODY_BYTES_CEILING = 1 << 30


def byte_count(key: str, value: str) -> int:
    """A body limit in bytes, 1 KiB..1 GiB, its digits counted before it is converted."""
    text = value.strip()
    expected = f"expected a whole number of bytes, 1024..{_MAX_BODY_BYTES_CEILING}"
    # Digits are counted before int() so a huge value is refused, not converted.
    if not text.isdigit() or len(text) > 10:
        raise bad(key, value, expected)
    number = int(text)
    if not 1024 <= number <= _MAX_BODY_BYTES_CEILING:
        raise bad(key, value, expected)
    return number
