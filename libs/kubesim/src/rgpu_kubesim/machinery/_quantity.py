"""Kubernetes resource quantities ("500m", "2Gi", "1e3") as exact fractions.

Pod validation needs to know whether an extended-resource quantity is an integer and whether a
request equals its limit ("1" and "1000m" are equal); floats would get both wrong.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

_PATTERN = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?\Z"
)
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}

FORMAT_ERROR = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


def parse_quantity(text: object) -> Fraction:
    """Parse a quantity string (or a JSON number); raises ValueError with kube's message."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(FORMAT_ERROR)
    return _parse(str(text).strip())


# Every pod write validates its quantities again, and a cluster's pods repeat a few dozen
# distinct ones ("1", "100m", "128Mi"): remembering them keeps Fraction arithmetic off the
# write path. Fractions are immutable, so sharing one is safe.
@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> Fraction:
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(FORMAT_ERROR)
    digits, suffix = match.group(1), match.group(2) or ""
    # Whole numbers (nearly every quantity in a pod) stay in int arithmetic: Fraction(str) is slow.
    whole = "." not in digits
    number = Fraction(int(digits)) if whole else Fraction(digits)
    if suffix in _BINARY:
        return number * (1 << _BINARY[suffix])
    exponent = int(suffix[1:]) if suffix[:1] in {"e", "E"} else _DECIMAL[suffix]
    if exponent == 0:
        return number
    if whole and exponent > 0:
        return Fraction(int(digits) * 10**exponent)
    return number * (Fraction(10**exponent) if exponent > 0 else Fraction(1, 10**-exponent))


def is_integer(value: Fraction) -> bool:
    return value.denominator == 1
