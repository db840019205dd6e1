"""Every ``from_dict`` reads JSON the same careful way.

Each reader takes the parent mapping, the key and the parent's path, and either returns a
value of the promised Python type or raises one ``ContractError`` naming ``path.key``. JSON
booleans are never accepted as integers (``True`` is an ``int`` in Python, not on the wire).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar, cast

from .errors import ContractError

T = TypeVar("T")

_MISSING = object()

MAX_NAME_CHARS = 253
"""Kubernetes' limit on object names (a DNS subdomain): pods, nodes."""
MAX_NAMESPACE_CHARS = 63
"""Kubernetes' limit on namespace names (a DNS label)."""
MAX_DEPTH = 64
"""Kubernetes objects nest about twenty levels at most (managedFields included); JSON nested
deeper is refused, since encoders stop near 255 levels and an echoed reply would fail."""
MAX_UID_CHARS = 128
"""Kubernetes' UIDs are 36-character UUIDs; 128 leaves room for any other issuer's form while
keeping a 70,000-character "uid" out of URLs, logs and Lease annotations."""


def join(path: str, key: str | int) -> str:
    """Extend a contract path with a key (``a.b``) or an index (``a[3]``)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def as_mapping(raw: object, path: str) -> Mapping[str, object]:
    """Return ``raw`` as a JSON object or raise naming ``path``."""
    if not isinstance(raw, Mapping):
        raise ContractError(path, f"expected a JSON object, got {type_name(raw)}")
    return raw


def as_list(raw: object, path: str) -> Sequence[object]:
    """Return ``raw`` as a JSON array or raise naming ``path``."""
    if not isinstance(raw, list | tuple):
        raise ContractError(path, f"expected a JSON array, got {type_name(raw)}")
    return raw


def type_name(raw: object) -> str:
    """Name a JSON value's type the way a JSON author thinks of it."""
    if raw is None:
        return "null"
    if isinstance(raw, bool):
        return "boolean"
    if isinstance(raw, int | float):
        return "number"
    if isinstance(raw, str):
        return "string"
    if isinstance(raw, list | tuple):
        return "array"
    if isinstance(raw, Mapping):
        return "object"
    return type(raw).__name__


def _get(raw: Mapping[str, object], key: str, path: str, default: object) -> object:
    value = raw.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ContractError(join(path, key), "is required")
        return default
    return value


def string(raw: Mapping[str, object], key: str, path: str, default: object = _MISSING) -> str:
    """Read a string field; ``default`` makes it optional."""
    value = _get(raw, key, path, default)
    if not isinstance(value, str):
        raise ContractError(join(path, key), f"expected a string, got {type_name(value)}")
    return value


def opt_string(raw: Mapping[str, object], key: str, path: str) -> str | None:
    """Read a string field that may be absent or ``null``."""
    value = raw.get(key)
    if value is None:
        return None
    return string(raw, key, path)


def integer(
    raw: Mapping[str, object],
    key: str,
    path: str,
    default: object = _MISSING,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """Read an integer field (never a boolean, never a float), optionally bounded."""
    value = _get(raw, key, path, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(join(path, key), f"expected an integer, got {type_name(value)}")
    if minimum is not None and value < minimum:
        raise ContractError(join(path, key), f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ContractError(join(path, key), f"must be <= {maximum}, got {value}")
    return value


def number(raw: Mapping[str, object], key: str, path: str, default: object = _MISSING) -> float:
    """Read a finite JSON number as a float."""
    value = _get(raw, key, path, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractError(join(path, key), f"expected a number, got {type_name(value)}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ContractError(join(path, key), "must be a finite number")
    return float(value)


def opt_number(raw: Mapping[str, object], key: str, path: str) -> float | None:
    """Read a number that may be absent or ``null``."""
    if raw.get(key) is None:
        return None
    return number(raw, key, path)


def boolean(raw: Mapping[str, object], key: str, path: str, default: object = _MISSING) -> bool:
    """Read a boolean field."""
    value = _get(raw, key, path, default)
    if not isinstance(value, bool):
        raise ContractError(join(path, key), f"expected true or false, got {type_name(value)}")
    return value


def items(
    raw: Mapping[str, object],
    key: str,
    path: str,
    read: Callable[[object, str], T],
    default: object = _MISSING,
) -> tuple[T, ...]:
    """Read an array field, decoding each element with ``read(element, element_path)``."""
    value = _get(raw, key, path, default)
    field = join(path, key)
    return tuple(read(element, join(field, i)) for i, element in enumerate(as_list(value, field)))


def strings(
    raw: Mapping[str, object], key: str, path: str, default: object = _MISSING
) -> tuple[str, ...]:
    """Read an array of strings."""
    return items(raw, key, path, _string_element, default)


def _string_element(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ContractError(path, f"expected a string, got {type_name(value)}")
    return value


def string_map(
    raw: Mapping[str, object], key: str, path: str, default: object = _MISSING
) -> tuple[tuple[str, str], ...]:
    """Read an object of string values as sorted pairs (hashable and order-independent)."""
    value = _get(raw, key, path, default)
    field = join(path, key)
    pairs = []
    for k, v in as_mapping(value, field).items():
        if not isinstance(v, str):
            raise ContractError(join(field, k), f"expected a string, got {type_name(v)}")
        pairs.append((k, v))
    return tuple(sorted(pairs))


def choice(
    raw: Mapping[str, object],
    key: str,
    path: str,
    allowed: Sequence[str],
    default: object = _MISSING,
) -> str:
    """Read a string that must be one of ``allowed``."""
    value = string(raw, key, path, default)
    if value not in allowed:
        raise ContractError(join(path, key), f"must be one of {', '.join(allowed)}; got {value!r}")
    return value


def limited(value: str, path: str, max_chars: int) -> str:
    """Return ``value`` if it is at most ``max_chars`` long, else raise naming ``path``."""
    if len(value) > max_chars:
        raise ContractError(
            path, f"is {len(value)} characters long; Kubernetes allows at most {max_chars}"
        )
    return value


def opt_limited(raw: Mapping[str, object], key: str, path: str, max_chars: int) -> str | None:
    """Read an optional string (absent or ``null`` → ``None``) of at most ``max_chars``."""
    value = opt_string(raw, key, path)
    return None if value is None else limited(value, join(path, key), max_chars)


def shallow(raw: object, path: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise naming ``path`` when ``raw`` nests arrays or objects deeper than ``max_depth``.

    Level by level and containers only (scalars are skipped by their exact type before any
    slower check), so a document of a hundred thousand values costs milliseconds; iterative,
    so the check itself cannot run out of stack on what it refuses.
    """
    level = [raw] if _is_container(raw) else []
    for _ in range(max_depth):
        below: list[object] = []
        for value in level:
            children: Iterable[object] = (
                value.values()
                if value.__class__ is dict or isinstance(value, Mapping)
                else cast("Iterable[object]", value)
            )
            below += [c for c in children if c.__class__ not in _SCALARS and _is_container(c)]
        if not below:
            return
        level = below
    raise ContractError(path, f"nests deeper than {max_depth} levels; no Kubernetes object does")


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _is_container(value: object) -> bool:
    cls = value.__class__
    return cls is dict or cls is list or isinstance(value, Mapping | list | tuple)
