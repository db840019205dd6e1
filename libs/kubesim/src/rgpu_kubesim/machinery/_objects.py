"""Stored objects: the encoded body plus the few fields selectors need.

A hundred thousand pods must fit and list fast, so the store keeps each object as its JSON
bytes (encoded once, without kind/apiVersion, which is exactly how list items look on the wire)
plus its labels and selectable field values. Decoding happens only when a request needs the
full object. Entries are immutable: an update makes a new one, so watch events, list pages and
in-flight responses can share them safely.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from rgpu_kubesim.machinery import status as _status
from rgpu_kubesim.machinery._resources import Resource
from rgpu_kubesim.machinery._selectors import field_values

JsonObj = dict[str, Any]
Key = tuple[str, str]
"""(namespace, name); namespace is "" for cluster-scoped objects."""

_META_ORDER = (
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored version of one object."""

    namespace: str
    name: str
    rv: int
    uid: str
    body: bytes
    labels: Mapping[str, str]
    fields: Mapping[str, str]

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    def decode(self) -> dict[str, Any]:
        """A fresh, mutable copy of the object (without kind/apiVersion)."""
        decoded: dict[str, Any] = orjson.loads(self.body)
        return decoded


def make_entry(resource: Resource, obj: dict[str, Any]) -> Entry:
    """Encode ``obj`` (kind/apiVersion are dropped; no resourceVersion means 0: a dry run)."""
    obj.pop("kind", None)
    obj.pop("apiVersion", None)
    meta = obj["metadata"]
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return Entry(
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        rv=int(meta.get("resourceVersion") or 0),
        uid=meta.get("uid", ""),
        body=orjson.dumps(obj),
        labels=labels,
        fields=field_values(resource, obj),
    )


def type_prefix(resource: Resource) -> bytes:
    return b'{"kind":"%s","apiVersion":"%s",' % (
        resource.kind.encode(),
        resource.api_version.encode(),
    )


def full_bytes(resource: Resource, entry: Entry) -> bytes:
    """The object as GET returns it: kind and apiVersion first, then the stored body."""
    return type_prefix(resource) + entry.body[1:]


def full_object(resource: Resource, entry: Entry) -> dict[str, Any]:
    decoded: dict[str, Any] = orjson.loads(full_bytes(resource, entry))
    return decoded


def with_resource_version(resource: Resource, entry: Entry, rv: int) -> Entry:
    """The same content stamped with another resourceVersion (kube's DELETED-by-filter events)."""
    obj = entry.decode()
    obj["metadata"]["resourceVersion"] = str(rv)
    return make_entry(resource, obj)


def timestamp(seconds: float) -> str:
    """RFC 3339 in UTC with second precision, as metav1.Time serialises."""
    moment = datetime.datetime.fromtimestamp(int(seconds), tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def copy_object(resource: Resource, obj: object) -> JsonObj:
    """A deep copy of a request body, checked to be an object of the resource's kind."""
    if not isinstance(obj, dict):
        raise _status.undecodable(resource, "expected a JSON object")
    for field, expected in (("kind", resource.kind), ("apiVersion", resource.api_version)):
        given = obj.get(field)
        if given not in (None, "", expected):
            why = f"{field} {given!r} does not match the resource ({expected})"
            raise _status.undecodable(resource, why)
    try:
        copied: JsonObj = orjson.loads(orjson.dumps(obj))
    except TypeError as exc:
        raise _status.bad_request(f"the object is not valid JSON: {exc}") from exc
    copied.pop("kind", None)
    copied.pop("apiVersion", None)
    return copied


def ordered(obj: JsonObj) -> JsonObj:
    """The object with metadata first and its fields in ObjectMeta's order (as kube prints)."""
    meta = obj["metadata"]
    ordered_meta = {k: meta[k] for k in _META_ORDER if k in meta}
    ordered_meta.update((k, v) for k, v in meta.items() if k not in ordered_meta)
    return {"metadata": ordered_meta, **{k: v for k, v in obj.items() if k != "metadata"}}
