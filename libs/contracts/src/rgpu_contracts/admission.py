"""The webhook speaks AdmissionReview v1, whose details (uid echo,
base64 JSONPatch, JSON-pointer escaping, deny status) are easy to get subtly wrong."""

from __future__ import annotations

import base64
import builtins
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from . import _validate as v
from .errors import ContractError

__all__ = [
    "ADMISSION_API_VERSION",
    "AdmissionRequest",
    "UserInfo",
    "admission_allow",
    "admission_deny",
    "escape_pointer",
    "pointer",
]

ADMISSION_API_VERSION = "admission.k8s.io/v1"
_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


def escape_pointer(token: str) -> str:
    """Escape one JSON-pointer token (RFC 6901): ``~`` → ``~0`` first, then ``/`` → ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    """Build a JSON pointer from unescaped tokens: ``pointer("metadata", "annotations", "a/b")``."""
    return "".join("/" + escape_pointer(str(token)) for token in tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class UserInfo:
    """Who asked the apiserver for the change."""

    username: str
    groups: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> UserInfo:
        m = v.as_mapping(raw, path)
        return cls(
            username=v.string(m, "username", path, ""), groups=v.strings(m, "groups", path, ())
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionRequest:
    """The ``request`` of an AdmissionReview v1, with the pod objects kept as read-only JSON."""

    uid: str
    operation: str
    namespace: str
    name: str
    resource: str
    sub_resource: str
    user: UserInfo
    object: Mapping[str, Any] | None = field(default=None, hash=False)
    old_object: Mapping[str, Any] | None = field(default=None, hash=False)
    dry_run: bool = False

    @classmethod
    def from_review(cls, raw: builtins.object) -> AdmissionRequest:
        """Decode a whole AdmissionReview; only ``admission.k8s.io/v1`` is accepted."""
        review = v.as_mapping(raw, "")
        version = v.string(review, "apiVersion", "", ADMISSION_API_VERSION)
        if version != ADMISSION_API_VERSION:
            raise ContractError("apiVersion", f"expected {ADMISSION_API_VERSION}, got {version!r}")
        return cls.from_dict(review.get("request"), "request")

    @classmethod
    def from_dict(cls, raw: builtins.object, path: str = "") -> AdmissionRequest:
        m = v.as_mapping(raw, path)
        resource = v.as_mapping(m.get("resource", {}), v.join(path, "resource"))
        return cls(
            uid=_uid(m, path),
            operation=v.choice(m, "operation", path, _OPERATIONS),
            namespace=v.limited(
                v.string(m, "namespace", path, ""), v.join(path, "namespace"), v.MAX_NAMESPACE_CHARS
            ),
            name=v.limited(v.string(m, "name", path, ""), v.join(path, "name"), v.MAX_NAME_CHARS),
            resource=v.string(resource, "resource", v.join(path, "resource"), ""),
            sub_resource=v.string(m, "subResource", path, ""),
            user=UserInfo.from_dict(m.get("userInfo", {}), v.join(path, "userInfo")),
            object=_object(m, "object", path),
            old_object=_object(m, "oldObject", path),
            dry_run=v.boolean(m, "dryRun", path, False),
        )


def _uid(m: Mapping[str, object], path: str) -> str:
    uid = v.string(m, "uid", path)
    if not uid:
        raise ContractError(v.join(path, "uid"), "must not be empty; the response must echo it")
    return v.limited(uid, v.join(path, "uid"), v.MAX_UID_CHARS)


def _object(m: Mapping[str, object], key: str, path: str) -> Mapping[str, Any] | None:
    value = m.get(key)
    if value is None:
        return None
    v.shallow(value, v.join(path, key))
    return MappingProxyType(dict(v.as_mapping(value, v.join(path, key))))


def _review(response: dict[str, object]) -> dict[str, object]:
    return {"kind": "AdmissionReview", "apiVersion": ADMISSION_API_VERSION, "response": response}


def admission_allow(
    uid: str, patch: Sequence[Mapping[str, object]] = (), warnings: Sequence[str] = ()
) -> dict[str, object]:
    """Allow, with an optional JSONPatch (base64 of the JSON array, ``patchType: JSONPatch``)
    and warnings, which the apiserver returns to the client (kubectl prints each one)."""
    response: dict[str, object] = {"uid": uid, "allowed": True}
    if patch:
        encoded = json.dumps(list(patch), separators=(",", ":")).encode()
        response["patch"] = base64.b64encode(encoded).decode("ascii")
        response["patchType"] = "JSONPatch"
    if warnings:
        response["warnings"] = list(warnings)
    return _review(response)


def admission_deny(uid: str, message: str, code: int = 403) -> dict[str, object]:
    """Deny with an HTTP-like ``code`` and a message the user can act on."""
    return _review({"uid": uid, "allowed": False, "status": {"message": message, "code": code}})
