"""Each room's ``__all__`` is sorted and lists exactly the room's public names."""

from __future__ import annotations

import importlib
import types

import pytest

import rgpu_runtime
from rgpu_runtime import errors

ROOMS = ("feeds", "kube", "pacing", "peers", "replicas", "serving", "settings", "telemetry")


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions.
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def _public(module: types.ModuleType) -> set[str]:
    names = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    names.discard("annotations")
    return names


@pytest.mark.parametrize("room", ROOMS)
def test_a_rooms_all_is_sorted_and_lists_every_public_name(room: str) -> None:
    module = importlib.import_module(f"rgpu_runtime.{room}")
    assert module.__all__ == sorted(module.__all__, key=_isort_key)
    assert _public(module) == set(module.__all__)


def test_the_error_tree_is_sorted_and_complete() -> None:
    assert errors.__all__ == sorted(errors.__all__, key=_isort_key)
    defined = {
        n
        for n in _public(errors)
        if getattr(getattr(errors, n), "__module__", "") == errors.__name__
    }
    assert defined == set(errors.__all__)


def test_the_package_itself_exports_nothing_but_its_rooms() -> None:
    for room in ROOMS:
        importlib.import_module(f"rgpu_runtime.{room}")
    assert _public(rgpu_runtime) == set()
