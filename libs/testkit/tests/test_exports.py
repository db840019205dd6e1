from __future__ import annotations

import rgpu_testkit


def _isort_style(name: str) -> tuple[int, str]:
    # The order ruff's RUF022 keeps: CONSTANTS, then Classes, then functions.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_all_is_sorted_and_names_every_public_export() -> None:
    public = {n for n in dir(rgpu_testkit) if not n.startswith("_") and n != "annotations"}
    modules = {n for n in public if type(getattr(rgpu_testkit, n)).__name__ == "module"}
    assert list(rgpu_testkit.__all__) == sorted(rgpu_testkit.__all__, key=_isort_style)
    assert set(rgpu_testkit.__all__) == public - modules
