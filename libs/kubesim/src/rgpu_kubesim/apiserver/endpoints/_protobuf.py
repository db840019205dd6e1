"""Reading Kubernetes protobuf bodies (``application/vnd.kubernetes.protobuf``).

kubectl's typed clients send protobuf and nothing else: ``kubectl create namespace``,
``create configmap``, ``create priorityclass``, ``create poddisruptionbudget``, ``create
serviceaccount``, ``create token`` and the evictions of ``kubectl drain``. client-go has no
fallback to JSON for protobuf (a 415 is final), so the simulator decodes them: the ``k8s\\0``
envelope (a ``runtime.Unknown`` naming apiVersion and kind), then the object by the field
numbers of the kind's ``generated.proto`` (``_protobuf_schema``), into the JSON shape the rest
of the server works on. Go's zero values of non-pointer fields are what gogo-protobuf writes
for "unset", so they are dropped as ``omitempty`` drops them in JSON; a pointer field keeps
its zero (``gracePeriodSeconds: 0``). Unknown field numbers are skipped, as Go does.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Iterator
from typing import Any

from rgpu_kubesim.apiserver.endpoints._protobuf_rbac import RBAC_KINDS
from rgpu_kubesim.apiserver.endpoints._protobuf_schema import KINDS, Field, Message
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import status as _status

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
_TYPE_META = Message("TypeMeta", {1: Field("apiVersion", "string"), 2: Field("kind", "string")})
_ZEROS: tuple[object, ...] = ("", 0, None, {}, [])


class ProtobufError(Exception):
    """The bytes are not a protobuf message of the expected shape."""


def decode(body: bytes) -> dict[str, Any]:
    """The object a protobuf request body carries, as JSON would carry it (with kind and
    apiVersion); 400 for a malformed body, 415 for a kind the simulator cannot decode."""
    if not body.startswith(_MAGIC):
        raise _status.bad_request(
            "the body is not a Kubernetes protobuf message (it must start with 'k8s\\x00')"
        )
    try:
        type_meta, raw = _envelope(body[len(_MAGIC) :])
        api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
        schema = KINDS.get(kind) or RBAC_KINDS.get(kind)
        if schema is None:
            raise _unsupported(api_version, kind)
        return {"kind": kind, "apiVersion": api_version, **_message(raw, schema)}
    except ProtobufError as exc:
        raise _status.bad_request(f"the protobuf body could not be decoded: {exc}") from exc


def _envelope(data: bytes) -> tuple[dict[str, Any], bytes]:
    """runtime.Unknown: typeMeta (1) and raw (2); a content encoding (3) is refused."""
    type_meta: dict[str, Any] = {}
    raw = b""
    for number, wire, value in _fields(data):
        if wire != _BYTES:
            raise ProtobufError(f"the envelope's field {number} has wire type {wire}")
        if number == 1:
            type_meta = _message(value, _TYPE_META)
        elif number == 2:
            raw = value
        elif number == 3 and value:
            raise ProtobufError(f"content encoding {value!r} is not supported")
    return type_meta, raw


def _unsupported(api_version: str, kind: str) -> ApiError:
    served = ", ".join(sorted({*KINDS, *RBAC_KINDS}))
    return _status.failure(
        415,
        f"the simulator decodes protobuf bodies of {served}, not {api_version} {kind or '?'}; "
        "send it as application/json",
    )


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data):
            raise ProtobufError("a varint runs past the end of the message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift >= 70:
            raise ProtobufError("a varint is longer than 10 bytes")


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) for every field of ``data``, in order."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if number == 0:
            raise ProtobufError("field number 0 is not allowed")
        if wire == _VARINT:
            value, at = _varint(data, at)
        elif wire == _BYTES:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ProtobufError(f"field {number} runs past the end of the message")
            value, at = data[at : at + size], at + size
        elif wire in (_FIXED64, _FIXED32):
            width = 8 if wire == _FIXED64 else 4
            value, at = data[at : at + width], at + width
        else:
            raise ProtobufError(f"field {number} has the unsupported wire type {wire}")
        yield number, wire, value


def _message(data: bytes, schema: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, wire, value in _fields(data):
        field = schema.fields.get(number)
        if field is None:
            continue
        if (wire == _VARINT) != (field.kind in ("int", "bool")) or wire not in (_VARINT, _BYTES):
            raise ProtobufError(f"{schema.name}.{field.name} came with wire type {wire}")
        _store(out, field, _scalar(field, value))
    # Go's zero value of a non-pointer field is what gogo writes for "unset": JSON omits it.
    for field in schema.fields.values():
        if not field.keep_zero and field.name in out and out[field.name] in _ZEROS:
            del out[field.name]
    return out


def _scalar(field: Field, value: Any) -> Any:
    kind = field.kind
    if kind == "int":
        return value - (1 << 64) if value >= 1 << 63 else value
    if kind == "bool":
        return bool(value)
    if kind == "string":
        return _text(field, value)
    if kind == "bytes":
        return base64.b64encode(value).decode()
    if kind == "time":
        return _time(_message(value, _TIME))
    if kind == "intstr":
        return _int_or_string(_message(value, _INT_OR_STRING))
    if kind == "map":
        entry = _message(value, field.entry())
        return (entry.get("key", ""), entry.get("value", ""))
    assert field.message is not None
    return _message(value, field.message)


def _text(field: Field, value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise ProtobufError(f"{field.name} is not UTF-8: {exc}") from exc


def _store(out: dict[str, Any], field: Field, value: Any) -> None:
    if field.kind == "map":
        out.setdefault(field.name, {})[value[0]] = value[1]
    elif field.repeated:
        out.setdefault(field.name, []).append(value)
    else:
        out[field.name] = value


_TIME = Message("Time", {1: Field("seconds", "int"), 2: Field("nanos", "int")})
_INT_OR_STRING = Message(
    "IntOrString",
    {1: Field("type", "int"), 2: Field("intVal", "int"), 3: Field("strVal", "string")},
)


def _time(value: dict[str, Any]) -> str | None:
    seconds = int(value.get("seconds", 0))
    if not seconds:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_string(value: dict[str, Any]) -> int | str:
    if value.get("type") == 1:
        return str(value.get("strVal", ""))
    return int(value.get("intVal", 0))
