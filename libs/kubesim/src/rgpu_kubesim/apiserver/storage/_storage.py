"""The storage engine behind both the HTTP API and the in-process `Store`.

`Storage` is the one door: every read, write and watch of the HTTP API and of `Store` goes
through it. It owns the write path (normalize, default, admit, validate and prepare by kind,
check preconditions and versions, generate names and uids) and hands the rest to its parts:
the versioned tables (`Tables`), the open watches (`Watches`) and the controllers that run
inside a write (`NamespaceController`, `DisruptionController`). Writes are synchronous and
never await, so each one is atomic with respect to the event loop: a read-modify-write inside
one call cannot interleave with another request. Everything a client can observe (uids,
versions, generated names, events) comes from here, so HTTP requests and direct `Store` calls
behave identically.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rgpu_kubesim.apiserver.kinds import graceful as _graceful
from rgpu_kubesim.apiserver.kinds import namespaces as _namespaces
from rgpu_kubesim.apiserver.kinds import priority as _priority
from rgpu_kubesim.apiserver.kinds import strategies as _strategies
from rgpu_kubesim.apiserver.storage._controllers import DisruptionController, NamespaceController
from rgpu_kubesim.apiserver.storage._paging import ListPage
from rgpu_kubesim.apiserver.storage._preconditions import (
    check_namespace,
    check_preconditions,
    check_version,
    patched,
    set_condition,
    unbindable,
)
from rgpu_kubesim.apiserver.storage._tables import Observer, Tables
from rgpu_kubesim.apiserver.storage._watches import Watches, WatchStart
from rgpu_kubesim.apiserver.storage._watching import ADDED, DELETED, MODIFIED, Watcher, WatchHub
from rgpu_kubesim.machinery import (
    Entry,
    Filter,
    Resource,
    copy_object,
    make_entry,
    ordered,
    require,
    timestamp,
)
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_EVERYTHING = Filter()
_NAMESPACES = require("namespaces")
_PODS = require("pods")
_CLASSES = require("priorityclasses")


class Storage:
    """All objects of the simulated cluster; see the module docstring."""

    def __init__(
        self,
        *,
        seed: int = 0,
        watch_window: int = 10_000,
        watch_capacity: int = 1_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._rng = random.Random(seed)
        self._clock = clock
        self.hub = WatchHub()
        self._tables = Tables(watch_window=watch_window, publish=self.hub.dispatch)
        self._watches = Watches(self._tables, self.hub, capacity=watch_capacity)
        self._namespaces = NamespaceController(self._tables, self._commit, clock)
        self._budgets = DisruptionController(self._tables, self._commit, clock)
        for name in SYSTEM_NAMESPACES:
            self.create(_NAMESPACES, "", {"metadata": {"name": name}})
        for priority_class in _priority.SYSTEM_CLASSES:
            self.create(_CLASSES, "", priority_class)

    def observe(self, plural: str, observer: Observer) -> None:
        """Call ``observer`` with every change of ``plural`` as it commits, before the write
        returns: in-process controllers (RBAC's index and aggregation, namespace grants) that
        must never lag the write a request is authorized against next."""
        self._tables.observe(plural, observer)

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out (every write increments it by one)."""
        return self._tables.resource_version

    def revision(self, resource: Resource) -> int:
        """The resourceVersion of the last write to any object of ``resource`` (0: none):
        what a cache derived from all of them is stamped with."""
        return self._tables.revision(resource)

    def patched(
        self, resource: Resource, current: Entry, patch: object, content_type: str
    ) -> JsonObj:
        """``current`` with ``patch`` applied (not stored); 415 for unknown patch types."""
        return patched(resource, current, patch, content_type)

    # -- reads -------------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str, name: str) -> Entry:
        return self._tables.get(resource, namespace, name)

    def list_entries(
        self,
        resource: Resource,
        wanted: Filter = _EVERYTHING,
        *,
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
        match: str = "",
    ) -> ListPage:
        """One page of matching entries; see `Listing.page`."""
        return self._tables.listing.page(
            resource,
            wanted,
            limit=limit,
            continue_token=continue_token,
            resource_version=resource_version,
            match=match,
        )

    def open_watch(
        self,
        resource: Resource,
        wanted: Filter = _EVERYTHING,
        *,
        resource_version: str = "",
        send_initial: bool = False,
        audit: bool = False,
    ) -> WatchStart:
        """Register a watcher; the caller must `close_watch` it when the stream ends."""
        return self._watches.open(
            resource,
            wanted,
            resource_version=resource_version,
            send_initial=send_initial,
            audit=audit,
        )

    def close_watch(self, watcher: Watcher) -> None:
        self._watches.close(watcher)

    # -- writes ------------------------------------------------------------------------------

    def normalize(
        self, resource: Resource, namespace: str, obj: object, *, name: str | None = None
    ) -> JsonObj:
        """Deep-copy a request body, check kind/name/namespace against the request, default it."""
        body = copy_object(resource, obj)
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _status.bad_request(f"{resource.kind}.metadata: expected an object")
        check_namespace(resource, namespace, meta)
        if name is not None and meta.get("name") != name:
            raise _status.name_mismatch(str(meta.get("name", "")), name)
        _strategies.apply_defaults(resource, body)
        return body

    def create(
        self, resource: Resource, namespace: str, obj: object, *, dry_run: bool = False
    ) -> Entry:
        """Store a new object; with ``dry_run`` only answer what would be stored."""
        body = self.normalize(resource, namespace, obj)
        meta = body["metadata"]
        self.require_namespace(resource, namespace, str(meta.get("name") or ""))
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(self._rng.choices(_NAME_ALPHABET, k=5))
        self._admit_priority(resource, body)
        _strategies.prepare_for_create(resource, body)
        _strategies.validate(resource, body, None)
        if self._tables.find(resource, namespace, meta["name"]) is not None:
            raise _status.already_exists(resource, meta["name"])
        meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        meta["generation"] = 1
        meta["creationTimestamp"] = timestamp(self._clock())
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(transient, None)
        return self._commit(resource, ADDED, body, None, dry_run=dry_run)

    def _admit_priority(self, resource: Resource, body: JsonObj) -> None:
        """kube's Priority admission plugin (it also guards the single default class)."""
        if resource is _PODS:
            _priority.admit_pod(body, self._priority_classes())
        elif resource is _CLASSES:
            _priority.check_single_default(body, self._priority_classes().values())

    def _priority_classes(self) -> dict[str, JsonObj]:
        return {e.name: e.decode() for e in self._tables.entries(_CLASSES)}

    def require_namespace(self, resource: Resource, namespace: str, name: str = "") -> None:
        """Creating in a missing namespace is a 404; in a terminating one, a 403."""
        if not resource.namespaced:
            return
        found = self._tables.find(_NAMESPACES, "", namespace)
        if found is None:
            raise _status.not_found(_NAMESPACES, namespace)
        if _namespaces.is_terminating(found):
            raise _namespaces.being_terminated(resource, name, namespace)

    def update(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        obj: object,
        *,
        subresource: str = "",
        dry_run: bool = False,
        normalized: bool = False,
    ) -> Entry:
        """Replace the stored object; ``normalized`` says ``obj`` is already ``normalize``'s
        own result for this name (a private copy, defaulted) and needs no second pass."""
        body = obj if normalized else self.normalize(resource, namespace, obj, name=name)
        assert isinstance(body, dict)
        current = self.get(resource, namespace, name)
        check_version(resource, body, current)
        old = current.decode()
        new = _strategies.prepare_for_update(resource, body, old, subresource)
        new["metadata"]["resourceVersion"] = str(current.rv)
        _strategies.validate(resource, new, old, subresource)
        if resource is _CLASSES:
            _priority.check_single_default(new, self._priority_classes().values())
        if new == old:
            return current
        entry = self._commit(resource, MODIFIED, new, current, dry_run=dry_run)
        if resource is _NAMESPACES and not dry_run and _namespaces.releasable(new):
            self._commit(resource, DELETED, new, entry)
        return entry

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: object,
        content_type: str,
        *,
        subresource: str = "",
        dry_run: bool = False,
    ) -> Entry:
        current = self.get(resource, namespace, name)
        body = patched(resource, current, patch, content_type)
        return self.update(
            resource, namespace, name, body, subresource=subresource, dry_run=dry_run
        )

    def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        preconditions: Mapping[str, Any] | None = None,
        *,
        dry_run: bool = False,
        grace_period_seconds: int | None = None,
    ) -> Entry:
        """Delete now, or start terminating: a namespace, or a pod bound to a node.

        A bound pod gets ``deletionTimestamp`` and stays until its kubelet deletes it with
        ``grace_period_seconds=0``; ``dry_run`` changes nothing.
        """
        current = self.get(resource, namespace, name)
        check_preconditions(resource, current, preconditions or {})
        if resource is _NAMESPACES:
            return self._namespaces.terminate(current, dry_run=dry_run)
        if resource is _PODS:
            body = _graceful.terminating(current.decode(), grace_period_seconds, self._clock())
            if body is not None:
                if body == current.decode():
                    return current
                return self._commit(_PODS, MODIFIED, body, current, dry_run=dry_run)
        if dry_run:
            return current
        return self._commit(resource, DELETED, current.decode(), current)

    def finalize_namespaces(self) -> None:
        """The namespace controller's pass: empty, finalize and release terminating namespaces."""
        self._namespaces.finalize()

    def bind(self, namespace: str, name: str, binding: Mapping[str, Any]) -> Entry:
        """pods/binding: set spec.nodeName and merge the Binding's annotations in one write."""
        current = self.get(_PODS, namespace, name)
        meta = binding.get("metadata") or {}
        check_preconditions(_PODS, current, meta)
        pod = current.decode()
        why = unbindable(pod, name)
        if why:
            raise _status.conflict(_PODS, name, why, qualified="pods/binding")
        pod["spec"]["nodeName"] = (binding.get("target") or {}).get("name")
        annotations = meta.get("annotations") or {}
        if annotations:
            pod["metadata"]["annotations"] = {
                **(pod["metadata"].get("annotations") or {}),
                **annotations,
            }
        set_condition(pod.setdefault("status", {}), "PodScheduled", timestamp(self._clock()))
        return self._commit(_PODS, MODIFIED, pod, current)

    def _commit(
        self,
        resource: Resource,
        kind: str,
        obj: JsonObj,
        prev: Entry | None,
        *,
        dry_run: bool = False,
    ) -> Entry:
        if dry_run:
            # What would be stored: a create has no resourceVersion yet, an update keeps its own.
            if prev is None:
                obj["metadata"].pop("resourceVersion", None)
            return make_entry(resource, ordered(obj))
        entry = self._tables.commit(resource, kind, obj, prev)
        self._budgets.written(resource, entry, prev)
        return entry

    # -- faults ------------------------------------------------------------------------------

    def expire_before(self, resource_version: int | None) -> None:
        """Resuming a watch (or a paged list) from a version older than this gets 410."""
        self._tables.expire_before(resource_version)

    def entries(self, resource: Resource) -> Iterable[Entry]:
        return self._tables.entries(resource)
