"""The environment as settings read it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Env"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Env:
    """The environment as settings read it: an empty or blank value counts as unset."""

    environ: Mapping[str, str]

    def get(self, key: str) -> str | None:
        """The value of ``key``, or None when it is unset, empty or blank."""
        value = self.environ.get(key, "")
        return value if value.strip() else None

    def read(self, key: str, parse: Callable[[str, str], T], default: T) -> T:
        """``parse(key, value)``, or ``default`` when ``key`` is unset."""
        value = self.get(key)
        return default if value is None else parse(key, value)
