"""The webhook patches the pod it reads, so every field it reads or patches must have the JSON
type Kubernetes gives it: an env entry whose ``name`` is a list would otherwise crash the
mutation (a 500, and with ``failurePolicy: Fail`` a refused pod with no reason). The apiserver
checks types before it calls a webhook, but anyone who reaches ``/mutate`` can send anything;
this refuses such a pod naming the field, before anything else reads it.

Absent and ``null`` are accepted everywhere, as the readers treat them alike (``mapping``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

from .errors import MalformedPod

__all__ = ["check_pod"]

Shape = Union[type[str], "ListOf", "MapOf", Mapping[str, "Shape"]]


class ListOf:
    """A JSON array of ``item``."""

    __slots__ = ("item",)

    def __init__(self, item: Shape) -> None:
        self.item = item


class MapOf:
    """A JSON object of string values (annotations, labels)."""

    __slots__ = ()


_NAMED: Mapping[str, Shape] = {"name": str}
_ENV: Mapping[str, Shape] = {"name": str, "value": str, "valueFrom": {}}
_QUANTITIES: Mapping[str, Shape] = {"limits": {}, "requests": {}}
_CONTAINER: Mapping[str, Shape] = {
    "name": str,
    "env": ListOf(_ENV),
    "volumeMounts": ListOf(_NAMED),
    "resources": _QUANTITIES,
}
_TERM: Mapping[str, Shape] = {"matchExpressions": ListOf({"key": str, "operator": str})}
_AFFINITY: Mapping[str, Shape] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ListOf(_TERM)}
    }
}
_POD: Mapping[str, Shape] = {
    "metadata": {
        "name": str,
        "generateName": str,
        "namespace": str,
        "uid": str,
        "annotations": MapOf(),
    },
    "spec": {
        "nodeName": str,
        "schedulerName": str,
        "containers": ListOf(_CONTAINER),
        "initContainers": ListOf(_CONTAINER),
        "ephemeralContainers": ListOf(_CONTAINER),
        "volumes": ListOf(_NAMED),
        "affinity": _AFFINITY,
    },
}

_MAX_CHARS = {
    "metadata.name": 253,
    "metadata.generateName": 253,
    "metadata.namespace": 63,
    "metadata.uid": 128,
    "spec.nodeName": 253,
}
"""Kubernetes' own limits on the identity fields that messages repeat."""


def check_pod(pod: Mapping[str, Any] | None) -> None:
    """Raise ``MalformedPod`` naming the first field of the wrong type or length."""
    if pod is not None:
        _check(pod, _POD, "")


def _check(value: object, shape: Shape, path: str) -> None:
    # Exact-type tests first: most values are what they should be, and the abstract-class
    # checks below cost several times more (a review of 32,768 values is walked here).
    if value is None or (shape is str and value.__class__ is str and path not in _MAX_CHARS):
        return
    if shape is str:
        _check_text(value, path)
    elif isinstance(shape, ListOf):
        _check_list(value, shape.item, path)
    elif isinstance(shape, MapOf):
        _check_map(value, path)
    elif isinstance(shape, Mapping):
        _check_object(value, shape, path)


def _check_text(value: object, path: str) -> None:
    if not isinstance(value, str):
        raise MalformedPod(path, f"expected a string, got {json_type(value)}")
    most = _MAX_CHARS.get(path)
    if most is not None and len(value) > most:
        raise MalformedPod(path, f"is {len(value)} characters; Kubernetes allows at most {most}")


def _check_list(value: object, item: Shape, path: str) -> None:
    if not isinstance(value, list):
        raise MalformedPod(path, f"expected an array, got {json_type(value)}")
    fields = item if isinstance(item, Mapping) else None
    for index, element in enumerate(value):
        if element.__class__ is not dict and not isinstance(element, Mapping):
            raise MalformedPod(f"{path}[{index}]", f"expected an object, got {json_type(element)}")
        if fields is not None:
            _check_fields(element, fields, path, index)
        else:
            _check(element, item, f"{path}[{index}]")


def _check_fields(
    element: Mapping[str, Any], shape: Mapping[str, Shape], path: str, index: int
) -> None:
    # The element's path is spelled only when a field needs a closer look (or is wrong).
    for key, inner in shape.items():
        value = element.get(key)
        if value is not None and not (inner is str and value.__class__ is str):
            _check(value, inner, f"{path}[{index}].{key}")


def _check_map(value: object, path: str) -> None:
    if not isinstance(value, Mapping):
        raise MalformedPod(path, f"expected an object, got {json_type(value)}")
    for key, item in value.items():
        if item.__class__ is not str and not isinstance(item, str):
            raise MalformedPod(f"{path}[{key!r}]", f"expected a string, got {json_type(item)}")


def _check_object(value: object, shape: Mapping[str, Shape], path: str) -> None:
    if not isinstance(value, Mapping):
        raise MalformedPod(path, f"expected an object, got {json_type(value)}")
    for key, inner in shape.items():
        _check(value.get(key), inner, f"{path}.{key}" if path else key)


def json_type(value: object) -> str:
    """A JSON value's type as a manifest author names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
