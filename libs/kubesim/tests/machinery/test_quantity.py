"""Kubernetes quantity parsing."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rgpu_kubesim.machinery._quantity import is_integer, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", Fraction(1)),
        ("1000m", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("2Gi", Fraction(2 * 1024**3)),
        ("1k", Fraction(1000)),
        ("1e3", Fraction(1000)),
        ("1.5", Fraction(3, 2)),
        (3, Fraction(3)),
        ("+2", Fraction(2)),
        ("-1", Fraction(-1)),
    ],
)
def test_parse_quantity_is_exact(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1Xi", True, None, "1 Gi"])
def test_invalid_quantity_raises_kubes_message(text: object) -> None:
    with pytest.raises(ValueError, match="quantities must match the regular expression"):
        parse_quantity(text)


def test_integer_check_uses_exact_values() -> None:
    assert is_integer(parse_quantity("1000m")) and not is_integer(parse_quantity("1500m"))
