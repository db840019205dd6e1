from __future__ import annotations

import types

import rgpu_runtime
from rgpu_runtime import errors


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions.
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def test_all_is_sorted() -> None:
    assert rgpu_runtime.__all__ == sorted(rgpu_runtime.__all__, key=_isort_key)
    assert errors.__all__ == sorted(errors.__all__, key=_isort_key)


def test_all_lists_every_public_name_and_nothing_else() -> None:
    public = {
        name
        for name, value in vars(rgpu_runtime).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    public.discard("annotations")
    assert public == set(rgpu_runtime.__all__)


def test_every_error_is_exported_at_the_top() -> None:
    assert set(errors.__all__) <= set(rgpu_runtime.__all__)
