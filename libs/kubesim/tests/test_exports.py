"""The public surface of rgpu_kubesim is explicit, sorted and complete."""

from __future__ import annotations

import rgpu_kubesim


def test_all_is_sorted() -> None:
    assert rgpu_kubesim.__all__ == sorted(rgpu_kubesim.__all__)


def test_all_names_every_public_attribute() -> None:
    public = {
        name
        for name, value in vars(rgpu_kubesim).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("rgpu_kubesim")
    }
    assert public == set(rgpu_kubesim.__all__)


def test_every_exported_name_resolves() -> None:
    for name in rgpu_kubesim.__all__:
        assert getattr(rgpu_kubesim, name) is not None
