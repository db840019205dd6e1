"""RFC 6902 JSONPatch operations that apply to the object as it is: an ``add`` below a member
that does not exist yet fails on the apiserver (a pod without annotations, a container without
env), so each helper creates the parent when it is absent; keys are RFC 6901-escaped
(annotation keys contain ``/``) by ``pointer``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rgpu_contracts import pointer

__all__ = ["Op", "Path", "append_item", "insert_first", "put", "put_member"]

Op = dict[str, Any]
Path = Sequence[str | int]


def put(path: Path, value: object, *, exists: bool) -> Op:
    """Set the value at ``path``: ``replace`` when it exists, ``add`` when it does not."""
    return {"op": "replace" if exists else "add", "path": pointer(*path), "value": value}


def put_member(parent: Path, current: Mapping[str, Any] | None, key: str, value: object) -> Op:
    """Set ``parent[key]``, creating the parent object when ``current`` is absent."""
    if current is None:
        return {"op": "add", "path": pointer(*parent), "value": {key: value}}
    return put([*parent, key], value, exists=key in current)


def append_item(parent: Path, current: Sequence[Any] | None, value: object) -> Op:
    """Append to the list at ``parent``, creating the list when ``current`` is absent."""
    if current is None:
        return {"op": "add", "path": pointer(*parent), "value": [value]}
    return {"op": "add", "path": pointer(*parent, "-"), "value": value}


def insert_first(parent: Path, current: Sequence[Any] | None, value: object) -> Op:
    """Insert at index 0 of the list at ``parent``, creating the list when absent."""
    if current is None:
        return {"op": "add", "path": pointer(*parent), "value": [value]}
    return {"op": "add", "path": pointer(*parent, 0), "value": value}
