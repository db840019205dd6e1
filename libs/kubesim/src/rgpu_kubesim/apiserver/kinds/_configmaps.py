"""ConfigMaps (core/v1): what kube-apiserver refuses in one, on decoding and on validation.

rgpu's queue configuration lives in a ConfigMap that an operator edits with kubectl, so the
simulator must refuse what a cluster would: values that are not strings (a decoding error,
400), keys outside the config-key grammar, a key in both ``data`` and ``binaryData``, more
than 1 MiB in all, and any change to an ``immutable`` one (422 with kube's field paths).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from rgpu_kubesim.machinery import Cause, Resource, forbidden, invalid_value
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]

MAX_BYTES = 1024 * 1024
"""kube's MaxSecretSize, which bounds a ConfigMap's data and binaryData together."""
_KEY = re.compile(r"[-._a-zA-Z0-9]+\Z")
_KEY_MESSAGE = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. "
    "'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
)
_IMMUTABLE = "field is immutable when `immutable` is set"
_GO_TYPES = {bool: "bool", int: "number", float: "number", list: "array", dict: "object"}


def check_decodable(resource: Resource, obj: JsonObj) -> None:
    """What Go's decoder refuses (400): non-string values, bad base64, a non-bool flag."""
    for field in ("data", "binaryData"):
        values = obj.get(field)
        if values is None:
            continue
        if not isinstance(values, dict):
            _undecodable(resource, field, values, "map[string]string")
        for key, value in values.items():
            if not isinstance(value, str):
                _undecodable(resource, field, value, "string")
            if field == "binaryData":
                _check_base64(resource, key, value)
    flag = obj.get("immutable")
    if flag is not None and not isinstance(flag, bool):
        _undecodable(resource, "immutable", flag, "bool")


def _undecodable(resource: Resource, field: str, value: Any, wanted: str) -> None:
    given = "string" if isinstance(value, str) else _GO_TYPES.get(type(value), "value")
    why = f"json: cannot unmarshal {given} into Go struct field ConfigMap.{field} of type {wanted}"
    raise _status.undecodable(resource, why)


def _check_base64(resource: Resource, key: str, value: str) -> None:
    try:
        base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise _status.undecodable(resource, f"binaryData[{key}]: illegal base64 data") from exc


def key_errors(key: str) -> list[str]:
    """kube's IsConfigMapKey."""
    errors = []
    if len(key) > 253:
        errors.append("must be no more than 253 characters")
    if not _KEY.match(key):
        errors.append(_KEY_MESSAGE)
    if key == ".":
        errors.append("must not be '.'")
    elif key == "..":
        errors.append("must not be '..'")
    elif key.startswith(".."):
        errors.append("must not start with '..'")
    return errors


def causes(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[Cause]:
    """ValidateConfigMap, and ValidateConfigMapUpdate when ``old`` is given."""
    found = _immutable_causes(obj, old) if old is not None else []
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    for key in data:
        found += [invalid_value(f"data[{key}]", key, e) for e in key_errors(key)]
        if key in binary:
            why = "duplicate of key present in binaryData"
            found.append(invalid_value(f"data[{key}]", key, why))
    for key in binary:
        found += [invalid_value(f"binaryData[{key}]", key, e) for e in key_errors(key)]
    size = sum(len(v.encode()) for v in data.values())
    size += sum(len(base64.b64decode(v)) for v in binary.values())
    if size > MAX_BYTES:
        detail = f"Too long: may not be more than {MAX_BYTES} bytes"
        found.append(Cause(field="", reason="FieldValueTooLong", detail=detail))
    return found


def _immutable_causes(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    if not old.get("immutable"):
        return []
    found = [] if new.get("immutable") else [forbidden("immutable", _IMMUTABLE)]
    for field in ("data", "binaryData"):
        if (new.get(field) or {}) != (old.get(field) or {}):
            found.append(forbidden(field, _IMMUTABLE))
    return found


def entry_count(config_map: Mapping[str, Any]) -> int:
    """kubectl's DATA column: keys in data and binaryData together."""
    return len(config_map.get("data") or {}) + len(config_map.get("binaryData") or {})
