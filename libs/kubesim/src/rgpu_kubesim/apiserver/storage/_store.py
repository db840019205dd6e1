"""In-process access to the simulated cluster's objects, for seeding and assertions.

Tests and the demo need to put hundreds of nodes in place or check an object without a round
trip through HTTP. `Store` goes through the same storage engine as the HTTP API (validation,
defaulting, resourceVersions, watch events), but it bypasses admission webhooks and fault
injection, which belong to the request pipeline. Objects go in and come out as plain dicts;
what you get back is a copy, so mutating it never changes the stored object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson

from rgpu_kubesim.apiserver.storage._storage import Storage
from rgpu_kubesim.apiserver.storage._watching import Watcher
from rgpu_kubesim.machinery import (
    PATCH_TYPES,
    RESOURCES,
    Resource,
    by_plural,
    full_object,
    parse_filter,
)
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]


class Store:
    """Direct, synchronous access to every object; see the module docstring.

    ``resource`` is the plural name: ``nodes``, ``pods``, ``events``, ``leases``,
    ``configmaps``, ``namespaces``, ``mutatingwebhookconfigurations``, ``serviceaccounts``,
    ``priorityclasses`` or ``poddisruptionbudgets``. ``namespace`` defaults to the
    object's own ``metadata.namespace``, then ``default``; it is ignored for cluster-scoped
    kinds. Every method raises `rgpu_kubesim.errors.ApiError` exactly where the HTTP API
    would answer with that Status. Call it from the event loop that runs the server: the
    storage is not locked, its atomicity comes from never awaiting inside a write.
    """

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    @property
    def resource_version(self) -> int:
        """The cluster's current resourceVersion (every write increments it)."""
        return self._storage.resource_version

    def create(
        self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        """Create ``obj``; 409 AlreadyExists, 404 for a missing namespace, 422 if invalid."""
        kind = _resource(resource)
        entry = self._storage.create(kind, _namespace(kind, namespace, obj), dict(obj))
        return full_object(kind, entry)

    def get(self, resource: str, name: str, *, namespace: str | None = None) -> JsonObj:
        """The object; raises a 404 ApiError when it does not exist."""
        kind = _resource(resource)
        return full_object(kind, self._storage.get(kind, _namespace(kind, namespace, None), name))

    def list(
        self,
        resource: str,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[JsonObj]:
        """Matching objects in key order; ``namespace=None`` lists every namespace."""
        kind = _resource(resource)
        wanted = parse_filter(kind, namespace, label_selector, field_selector)
        return [full_object(kind, e) for e in self._storage.list_entries(kind, wanted).entries]

    def replace(
        self,
        resource: str,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        subresource: str = "",
    ) -> JsonObj:
        """PUT semantics: compare-and-swap when ``metadata.resourceVersion`` is set (409 stale)."""
        kind = _resource(resource)
        name = str((obj.get("metadata") or {}).get("name", ""))
        entry = self._storage.update(
            kind, _namespace(kind, namespace, obj), name, dict(obj), subresource=subresource
        )
        return full_object(kind, entry)

    def patch(
        self,
        resource: str,
        name: str,
        patch: object,
        *,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str = "",
    ) -> JsonObj:
        """Apply a ``merge``, ``strategic`` or ``json`` patch (415 ApiError for anything else)."""
        kind = _resource(resource)
        content_type = PATCH_TYPES.get(patch_type)
        if content_type is None:
            raise _status.unsupported_media_type(PATCH_TYPES)
        ns = _namespace(kind, namespace, None)
        return full_object(
            kind, self._storage.patch(kind, ns, name, patch, content_type, subresource=subresource)
        )

    def delete(
        self,
        resource: str,
        name: str,
        *,
        namespace: str | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
    ) -> JsonObj:
        """Delete and return the object as last stored (409 if a precondition fails).

        A namespace is not removed at once: it comes back Terminating, its content is deleted,
        and the server's namespace controller removes it shortly after (as kube's does). A pod
        bound to a node comes back with ``deletionTimestamp`` set and stays until a kubelet
        deletes it with ``grace_period_seconds=0`` (which also removes it at once here).
        """
        kind = _resource(resource)
        entry = self._storage.delete(
            kind,
            _namespace(kind, namespace, None),
            name,
            preconditions,
            grace_period_seconds=grace_period_seconds,
        )
        return full_object(kind, entry)

    def bind(
        self,
        name: str,
        node: str,
        *,
        namespace: str = "default",
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> JsonObj:
        """pods/binding: set spec.nodeName and merge ``annotations`` in one MODIFIED event."""
        metadata: JsonObj = {
            "name": name,
            "namespace": namespace,
            "annotations": dict(annotations or {}),
        }
        if uid is not None:
            metadata["uid"] = uid
        binding = {
            "kind": "Binding",
            "apiVersion": "v1",
            "metadata": metadata,
            "target": {"kind": "Node", "name": node},
        }
        pods = _resource("pods")
        return full_object(pods, self._storage.bind(namespace, name, binding))

    @asynccontextmanager
    async def watch(
        self,
        resource: str,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        resource_version: str = "",
        audit: bool = False,
    ) -> AsyncIterator[AsyncIterator[JsonObj]]:
        """Watch in process: yields ``{"type": ..., "object": {...}}`` dicts until cut.

        With ``resource_version`` "" (or "0") the current objects come first as ADDED; with a
        version, the retained changes after it (410 ApiError when it is too old). An ``audit``
        watch (a verdict's evidence) is never cut, by a fault or by a reader falling behind.
        """
        kind = _resource(resource)
        wanted = parse_filter(kind, namespace, label_selector, field_selector)
        start = self._storage.open_watch(
            kind, wanted, resource_version=resource_version, audit=audit
        )
        try:
            yield _events(start.initial, start.watcher)
        finally:
            self._storage.close_watch(start.watcher)


async def _events(initial: Iterator[bytes], watcher: Watcher) -> AsyncIterator[JsonObj]:
    for line in initial:
        yield orjson.loads(line)
    while not watcher.closed:
        for line in await watcher.take(3600.0):
            yield orjson.loads(line)


def _resource(plural: str) -> Resource:
    resource = by_plural(plural)
    if resource is None:
        raise _status.failure(
            404,
            f'the server could not find the requested resource "{plural}"; use one of: '
            + ", ".join(r.plural for r in RESOURCES if not r.verbs),
            details={},
        )
    return resource


def _namespace(resource: Resource, namespace: str | None, obj: Mapping[str, Any] | None) -> str:
    if not resource.namespaced:
        return ""
    from_object = ((obj or {}).get("metadata") or {}).get("namespace")
    return namespace or from_object or "default"
