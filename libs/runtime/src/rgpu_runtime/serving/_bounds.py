"""Input is measured before it is converted, so no value can cost more than its size.

``int()`` of a string of thousands of digits raises (Python refuses over 4300) or takes time
quadratic in its length; a name of 70,000 characters flows into labels, logs and Leases; a
JSON array nested ten thousand deep sends recursive code past the stack. Each helper here
refuses such input with ``BadRequest`` (400) naming the field and what is accepted, before
the expensive or dangerous step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal, TypeAlias, cast

import orjson
from starlette.requests import Request

from rgpu_contracts import MAX_NAME_CHARS, MAX_NAMESPACE_CHARS, MAX_UID_CHARS
from rgpu_runtime.errors import BadRequest

__all__ = [
    "ADMISSION_REVIEW_MAX_BYTES",
    "DNS_LABEL_MAX",
    "DNS_SUBDOMAIN_MAX",
    "MAX_JSON_DEPTH",
    "UID_MAX",
    "bounded_int",
    "check_dns_label",
    "check_dns_subdomain",
    "check_uid",
    "decode_json",
    "read_bounded_json",
]

ADMISSION_REVIEW_MAX_BYTES = (3 << 20) + (3 << 19) + (64 << 10)
"""The body limit for a webhook's ``/mutate``: the apiserver refuses requests over 3 MiB, so the
``object`` it sends is at most that; an UPDATE also carries ``oldObject``, at most what etcd
stores (1.5 MiB); 64 KiB covers the review's envelope and userInfo. Anything larger did not
come from the apiserver."""
DNS_SUBDOMAIN_MAX = MAX_NAME_CHARS
"""Kubernetes' limit on object names (pods, nodes, namespaces' objects): RFC 1123 subdomain."""
DNS_LABEL_MAX = MAX_NAMESPACE_CHARS
"""Kubernetes' limit on namespaces and label values: RFC 1123 label."""
UID_MAX = MAX_UID_CHARS
"""Kubernetes uids are 36-character UUIDs; anything past the contracts' limit is not a uid."""
MAX_JSON_DEPTH = 64
"""Deepest nesting accepted: a Pod inside an AdmissionReview is about 12 levels deep, and
code walking the tree recursively stays far from Python's stack limit."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_UID = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]*")
_SIGNED_DIGITS = re.compile(r"[-+]?[0-9]+")

JsonKind = Literal["object", "array"]
_Trail: TypeAlias = "tuple[object, _Trail] | None"


def bounded_int(text: str, *, field: str, minimum: int, maximum: int) -> int:
    """Read a decimal integer in ``minimum..maximum``; raises ``BadRequest`` naming ``field``.

    The digits are counted first: a value longer than the bounds could ever be is refused
    without being converted.
    """
    expected = f"{field}: expected an integer {minimum}..{maximum}"
    stripped = text.strip()
    longest = max(len(str(minimum)), len(str(maximum))) + 1
    if len(stripped) > longest or not _SIGNED_DIGITS.fullmatch(stripped):
        raise BadRequest(f"{expected}, got {_preview(text)}")
    number = int(stripped)
    if not minimum <= number <= maximum:
        raise BadRequest(f"{expected}, got {number}")
    return number


def check_dns_subdomain(value: str, *, field: str) -> str:
    """Return ``value`` if it is a valid Kubernetes object name (at most 253 characters)."""
    if len(value) > DNS_SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.fullmatch(value):
        raise BadRequest(
            f"{field}: {_preview(value)} is not a Kubernetes name (lowercase letters, digits, "
            f"'-' and '.', at most {DNS_SUBDOMAIN_MAX} characters)"
        )
    return value


def check_dns_label(value: str, *, field: str) -> str:
    """Return ``value`` if it is a valid RFC 1123 label (namespaces; at most 63 characters)."""
    if len(value) > DNS_LABEL_MAX or not _DNS_LABEL.fullmatch(value):
        raise BadRequest(
            f"{field}: {_preview(value)} is not a Kubernetes label (lowercase letters, digits "
            f"and '-', at most {DNS_LABEL_MAX} characters)"
        )
    return value


def check_uid(value: str, *, field: str) -> str:
    """Return ``value`` if it can be a Kubernetes uid (at most 128 characters, no spaces)."""
    if len(value) > UID_MAX or not _UID.fullmatch(value):
        raise BadRequest(
            f"{field}: {_preview(value)} is not a Kubernetes uid (a UUID such as "
            f"3f1c...-...; letters, digits, '-', '_' and '.', at most {UID_MAX} characters)"
        )
    return value


def decode_json(
    body: bytes,
    *,
    what: str,
    expect: JsonKind = "object",
    max_depth: int = MAX_JSON_DEPTH,
) -> object:
    """Parse ``body`` as JSON whose top level is ``expect`` and nesting at most ``max_depth``.

    Raises ``BadRequest`` naming ``what`` and, for nesting, the JSON path where it went too
    deep. (orjson itself stops at 1024 levels, so parsing never recurses without bound.)
    """
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    if _json_type(value) != f"an {expect}":
        raise BadRequest(f"{what} must be a JSON {expect} at $, got {_json_type(value)}")
    too_deep = _too_deep(value, max_depth)
    if too_deep is not None:
        raise BadRequest(
            f"{what} nests deeper than {max_depth} levels at {too_deep}; flatten the document"
        )
    return value


async def read_bounded_json(
    request: Request,
    *,
    what: str,
    expect: JsonKind = "object",
    max_depth: int = MAX_JSON_DEPTH,
) -> object:
    """Read the body (under the route's size limit) and ``decode_json`` it."""
    return decode_json(await request.body(), what=what, expect=expect, max_depth=max_depth)


def _too_deep(root: object, max_depth: int) -> str | None:
    # Level by level, containers only: about half the cost of orjson.loads on a pod list, and
    # iterative, so the check cannot itself run out of stack. The path is found only for an
    # offender, by the slower walk that remembers how it got there.
    level: list[object] = [root]
    for _ in range(max_depth):
        below: list[object] = []
        for value in level:
            children = value.values() if isinstance(value, dict) else cast("list[object]", value)
            below += [c for c in children if c.__class__ is dict or c.__class__ is list]
        if not below:
            return None
        level = below
    return _deep_path(root, max_depth)


def _deep_path(root: object, max_depth: int) -> str:
    stack: list[tuple[object, int, _Trail]] = [(root, 1, None)]
    while stack:
        value, depth, trail = stack.pop()
        if depth > max_depth:
            return _spell(trail)
        items: Iterable[tuple[object, object]]
        items = value.items() if isinstance(value, dict) else enumerate(cast("list[object]", value))
        stack.extend(
            (child, depth + 1, (key, trail))
            for key, child in items
            if isinstance(child, (dict, list))
        )
    return "$"


def _spell(trail: _Trail) -> str:
    keys: list[object] = []
    while trail is not None:
        key, trail = trail
        keys.append(key)
    return "$" + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in reversed(keys))


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def _preview(value: str) -> str:
    text = value if len(value) <= 40 else f"{value[:40]}... ({len(value)} characters)"
    return repr(text)
