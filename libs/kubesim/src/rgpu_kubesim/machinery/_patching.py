"""The three PATCH semantics kube-apiserver accepts for built-in types.

* JSON merge patch (RFC 7386): maps merge, ``null`` deletes, lists are replaced.
* Strategic merge patch: merge patch plus kube's directives (``$patch``, ``$retainKeys``,
  ``$setElementOrder/…``, ``$deleteFromPrimitiveList/…``) and merging of well-known lists of
  objects by their merge key (containers by name, conditions by type, …).
* JSON patch (RFC 6902 with RFC 6901 pointers): add/remove/replace/move/copy/test.

Patches are applied to a freshly decoded document, so in-place mutation is safe here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from rgpu_kubesim.machinery import status as _status

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = {"merge": MERGE_PATCH, "strategic": STRATEGIC_PATCH, "json": JSON_PATCH}

# Lists kube merges element-wise in a strategic merge patch, keyed by the element field named.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "images": "names",
}


class PatchError(Exception):
    """A patch that is well-formed but cannot be applied (becomes a 422)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: apply ``patch`` to ``target`` and return the result."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge for maps and keyed lists; other lists are replaced."""
    if not isinstance(patch, dict):
        return patch
    directive = patch.get("$patch")
    if directive == "replace":
        return _without_directives(patch)
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        _strategic_field(result, key, value)
    if "$retainKeys" in patch:
        keep = set(patch["$retainKeys"] or ())
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _without_directives(patch: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in patch.items() if not k.startswith("$")}


def _strategic_field(result: dict[str, Any], key: str, value: Any) -> None:
    if key.startswith("$deleteFromPrimitiveList/"):
        name = key.partition("/")[2]
        drop = set(map(repr, value or ()))
        result[name] = [v for v in result.get(name) or () if repr(v) not in drop]
    elif key.startswith("$"):
        return
    elif value is None:
        result.pop(key, None)
    elif isinstance(value, list) and key in _MERGE_KEYS:
        result[key] = _merge_list(result.get(key), value, _MERGE_KEYS[key])
    else:
        merged = strategic_merge_patch(result.get(key), value)
        if merged is None:
            result.pop(key, None)
        else:
            result[key] = merged


def _merge_list(current: Any, patch: list[Any], merge_key: str) -> list[Any]:
    if not all(isinstance(item, dict) and merge_key in item for item in patch):
        return patch
    merged = list(current) if isinstance(current, list) else []
    for item in patch:
        index = _index_of(merged, merge_key, item[merge_key])
        if item.get("$patch") == "delete":
            if index is not None:
                del merged[index]
        elif index is None:
            # A typed decoder drops nulls of a new element; its directives are spent here.
            merged.append(strategic_merge_patch({}, item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged


def _index_of(items: list[Any], key: str, value: Any) -> int | None:
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get(key) == value:
            return index
    return None


def parse_pointer(pointer: str) -> list[str]:
    """RFC 6901: '' is the whole document; '~1' is '/', '~0' is '~'."""
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f'invalid JSON pointer "{pointer}": must start with "/"')
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]


def json_patch(document: Any, operations: Any) -> Any:
    """RFC 6902; raises ApiError 400 for a malformed patch, PatchError when an op fails."""
    if not isinstance(operations, list) or not all(isinstance(o, dict) for o in operations):
        raise _status.bad_request(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
        )
    for operation in operations:
        document = _apply_operation(document, operation)
    return document


def _apply_operation(document: Any, operation: Mapping[str, Any]) -> Any:
    op = operation.get("op")
    path = str(operation.get("path", ""))
    if op == "add":
        return _add(document, parse_pointer(path), copy.deepcopy(operation.get("value")), path)
    if op == "remove":
        return _remove(document, parse_pointer(path), path, op)[0]
    if op == "replace":
        document, _ = _remove(document, parse_pointer(path), path, op)
        return _add(document, parse_pointer(path), copy.deepcopy(operation.get("value")), path)
    if op in {"move", "copy"}:
        return _move_or_copy(document, operation, op, path)
    if op == "test":
        _test(document, path, operation.get("value"))
        return document
    raise PatchError(f"Unexpected kind: {op}")


def _move_or_copy(document: Any, operation: Mapping[str, Any], op: str, path: str) -> Any:
    source = str(operation.get("from", ""))
    value = copy.deepcopy(_resolve(document, parse_pointer(source), source, op))
    if op == "move":
        document, _ = _remove(document, parse_pointer(source), source, op)
    return _add(document, parse_pointer(path), value, path)


def _test(document: Any, path: str, expected: Any) -> None:
    failed = PatchError(f"testing value {path} failed: test failed")
    try:
        actual = _resolve(document, parse_pointer(path), path, "test")
    except PatchError as exc:
        raise failed from exc
    if not _json_equal(actual, expected):
        raise failed


def _json_equal(left: Any, right: Any) -> bool:
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_json_equal, left, right))
    comparable = type(left) is type(right) or {type(left), type(right)} <= {int, float}
    return comparable and bool(left == right)


def _resolve(document: Any, parts: list[str], path: str, op: str) -> Any:
    node = document
    for part in parts:
        node = _child(node, part, path, op)
    return node


def _child(node: Any, part: str, path: str, op: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise PatchError(f'{op} operation does not apply: doc is missing path: "{path}": missing value')


def _add(document: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _resolve(document, parts[:-1], path, "add")
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_insert_index(parent, last, path), value)
    else:
        raise PatchError(
            f'add operation does not apply: doc is missing path: "{path}": missing value'
        )
    return document


def _insert_index(parent: list[Any], last: str, path: str) -> int:
    if last == "-":
        return len(parent)
    if last.isdigit() and int(last) <= len(parent):
        return int(last)
    raise PatchError(f'add operation does not apply: doc is missing path: "{path}": missing value')


def _remove(document: Any, parts: list[str], path: str, op: str) -> tuple[Any, Any]:
    if not parts:
        return None, document
    parent = _resolve(document, parts[:-1], path, op)
    last = parts[-1]
    removed = _child(parent, last, path, op)
    if isinstance(parent, dict):
        del parent[last]
    else:
        del parent[int(last)]
    return document, removed
