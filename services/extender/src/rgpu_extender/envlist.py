"""A container's ``env`` is a list in which names may repeat (the last
one wins), and later entries may refer to earlier ones with ``$(NAME)``; setting a variable must
respect both, or a wired value silently loses to a user's stale literal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .pods import mapping

__all__ = ["Env", "env_list", "last_entry", "set_env"]

Env = list[dict[str, Any]]


def env_list(container: Mapping[str, Any]) -> Env:
    """A fresh copy of the container's env entries (empty when it has none)."""
    env = container.get("env")
    return [dict(mapping(e)) for e in env] if isinstance(env, list) else []


def last_entry(env: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The entry of ``name`` the kubelet would use (the last one), if any."""
    return next((e for e in reversed(env) if e.get("name") == name), None)


def set_env(env: Env, entries: Sequence[dict[str, Any]]) -> Env:
    """Return ``env`` with ``entries`` as the only definitions of their names, in their order.

    The block takes the place of the first existing definition of any of its names, so
    ``$(NAME)`` references after it still resolve; a block of new names goes first, where
    every later entry can refer to it.
    """
    names = {entry["name"] for entry in entries}
    positions = [i for i, e in enumerate(env) if e.get("name") in names]
    at = positions[0] if positions else 0
    before = [e for e in env[:at] if e.get("name") not in names]
    after = [e for e in env[at:] if e.get("name") not in names]
    return [*before, *entries, *after]
