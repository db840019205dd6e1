"""Names of things that must not be mixed up, checked by mypy.

A ``CardId`` is ``<server node name>/<GPU UUID>``; a ``GpuUuid`` is the bare UUID lupine reports.
"""

from __future__ import annotations

import hashlib
import re
from typing import NewType

__all__ = ["CardId", "GpuUuid", "NodeName", "PodUID", "ServerName", "prefixed_name"]

NodeName = NewType("NodeName", str)
ServerName = NewType("ServerName", str)
GpuUuid = NewType("GpuUuid", str)
CardId = NewType("CardId", str)
PodUID = NewType("PodUID", str)


_MAX_OBJECT_NAME = 63
"""Lease names are DNS subdomains (253), but 63 keeps them valid as labels too."""
_HASH_CHARS = 10
_NOT_IN_NAMES = re.compile(r"[^a-z0-9.-]")
"""Characters an object name (a DNS subdomain) cannot hold; a lupine instance's server name
(``<node>@<port>``) has one."""


def prefixed_name(prefix: str, name: str) -> str:
    """``prefix + name`` as an object name: itself when it fits in 63 characters and is a
    valid name, else a readable cut of ``name`` (other characters turned into ``-``) plus a
    hash of all of it, so distinct names never collide."""
    full = prefix + name
    if len(full) <= _MAX_OBJECT_NAME and not _NOT_IN_NAMES.search(name):
        return full
    digest = hashlib.sha256(name.encode()).hexdigest()[:_HASH_CHARS]
    keep = _MAX_OBJECT_NAME - len(prefix) - len(digest) - 1
    readable = _NOT_IN_NAMES.sub("-", name[:keep]).rstrip(".-")
    return f"{prefix}{readable}-{digest}"
