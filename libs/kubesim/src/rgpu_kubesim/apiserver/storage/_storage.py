"""The storage engine behind both the HTTP API and the in-process `Store`.

It owns every object, the global resourceVersion counter, the retained watch windows and the
open watchers. Writes are synchronous and never await, so each one is atomic with respect to
the event loop: a read-modify-write inside one call cannot interleave with another request.
Everything a client can observe (uids, versions, generated names, events) comes from here, so
HTTP requests and direct `Store` calls behave identically.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rgpu_kubesim.apiserver.kinds import (
    _disruption,
    _graceful,
    _namespaces,
    _priority,
    _strategies,
)
from rgpu_kubesim.apiserver.storage._listing import Listing
from rgpu_kubesim.apiserver.storage._paging import ListPage, parse_resource_version
from rgpu_kubesim.apiserver.storage._watching import (
    ADDED,
    DELETED,
    MODIFIED,
    Change,
    EventLog,
    Watcher,
    WatchHub,
    event_line,
)
from rgpu_kubesim.machinery import (
    JSON_PATCH,
    MERGE_PATCH,
    RESOURCES,
    STRATEGIC_PATCH,
    Entry,
    Filter,
    Key,
    LabelSelector,
    PatchError,
    Resource,
    _status,
    copy_object,
    full_bytes,
    full_object,
    invalid_value,
    json_patch,
    make_entry,
    merge_patch,
    ordered,
    require,
    strategic_merge_patch,
    timestamp,
)

JsonObj = dict[str, Any]

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_UNDELETABLE_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_PATCHERS: Mapping[str, Callable[[Any, Any], Any]] = {
    MERGE_PATCH: merge_patch,
    STRATEGIC_PATCH: strategic_merge_patch,
    JSON_PATCH: json_patch,
}
_EVERYTHING = Filter()
_NAMESPACES = require("namespaces")
_PODS = require("pods")
_CLASSES = require("priorityclasses")
_BUDGETS = require("poddisruptionbudgets")


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchStart:
    """An opened watch: the registered watcher and the lines to send before live events."""

    watcher: Watcher
    initial: Iterator[bytes]
    rv: int


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
        self._rv = 0
        self._capacity = watch_capacity
        self._objects: dict[str, dict[Key, Entry]] = {r.plural: {} for r in RESOURCES}
        self._sorted: dict[str, list[Key] | None] = {r.plural: [] for r in RESOURCES}
        self._logs = {r.plural: EventLog(watch_window, 0) for r in RESOURCES}
        self.hub = WatchHub()
        self._listing = Listing(self._objects, self._sorted, self._logs, lambda: self._rv)
        self._terminating: set[str] = set()
        self._revisions: dict[str, int] = {}
        self._syncing_budgets = False
        self._observers: dict[str, list[Callable[[Change], None]]] = {}
        for name in SYSTEM_NAMESPACES:
            self.create(_NAMESPACES, "", {"metadata": {"name": name}})
        for priority_class in _priority.SYSTEM_CLASSES:
            self.create(_CLASSES, "", priority_class)

    def observe(self, plural: str, observer: Callable[[Change], None]) -> None:
        """Call ``observer`` with every change of ``plural`` as it commits, before the write
        returns: in-process controllers (RBAC's index and aggregation, namespace grants) that
        must never lag the write a request is authorized against next."""
        self._observers.setdefault(plural, []).append(observer)

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out (every write increments it by one)."""
        return self._rv

    def revision(self, resource: Resource) -> int:
        """The resourceVersion of the last write to any object of ``resource`` (0: none):
        what a cache derived from all of them is stamped with."""
        return self._revisions.get(resource.plural, 0)

    # -- reads -------------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str, name: str) -> Entry:
        entry = self._objects[resource.plural].get((namespace, name))
        if entry is None:
            raise _status.not_found(resource, name)
        return entry

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
        return self._listing.page(
            resource,
            wanted,
            limit=limit,
            continue_token=continue_token,
            resource_version=resource_version,
            match=match,
        )

    def _keys_in(self, resource: Resource, namespace: str | None, after: Key | None) -> list[Key]:
        return self._listing.keys_in(resource, namespace, after)

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
        watcher = Watcher(resource, wanted, capacity=self._capacity, audit=audit)
        if send_initial or resource_version in ("", "0"):
            if resource_version not in ("", "0"):
                # A streaming list at a version not older than one this server has not reached.
                requested = parse_resource_version(resource_version)
                if requested > self._rv:
                    raise _status.too_large(requested, self._rv)
            initial = self._state_lines(resource, watcher)
        else:
            requested = parse_resource_version(resource_version)
            if requested > self._rv:
                raise _status.too_large(requested, self._rv)
            initial = iter(list(watcher.replay(self._logs[resource.plural].since(requested))))
        self.hub.add(watcher)
        return WatchStart(watcher=watcher, initial=initial, rv=self._rv)

    def _state_lines(self, resource: Resource, watcher: Watcher) -> Iterator[bytes]:
        table = self._objects[resource.plural]
        snapshot = [table[k] for k in self._keys_in(resource, watcher.wanted.namespace, None)]
        return (event_line(ADDED, full_bytes(resource, e)) for e in snapshot if watcher.matches(e))

    def close_watch(self, watcher: Watcher) -> None:
        watcher.close()
        self.hub.remove(watcher)

    # -- writes ------------------------------------------------------------------------------

    def normalize(
        self, resource: Resource, namespace: str, obj: object, *, name: str | None = None
    ) -> JsonObj:
        """Deep-copy a request body, check kind/name/namespace against the request, default it."""
        body = copy_object(resource, obj)
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _status.bad_request(f"{resource.kind}.metadata: expected an object")
        _check_namespace(resource, namespace, meta)
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
        if (namespace, meta["name"]) in self._objects[resource.plural]:
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
        return {e.name: e.decode() for e in self._objects[_CLASSES.plural].values()}

    def require_namespace(self, resource: Resource, namespace: str, name: str = "") -> None:
        """Creating in a missing namespace is a 404; in a terminating one, a 403."""
        if not resource.namespaced:
            return
        found = self._objects["namespaces"].get(("", namespace))
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
        self._check_version(resource, body, current)
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

    def _check_version(self, resource: Resource, body: JsonObj, current: Entry) -> None:
        wanted = body["metadata"].get("resourceVersion")
        if wanted in (None, ""):
            if not resource.unconditional_update:
                cause = invalid_value(
                    "metadata.resourceVersion", 0, "must be specified for an update"
                )
                raise _status.invalid_storage(resource, current.name, [cause])
            return
        if str(wanted) != str(current.rv):
            raise _status.modified_conflict(resource, current.name)

    def patched(
        self, resource: Resource, current: Entry, patch: object, content_type: str
    ) -> JsonObj:
        """``current`` with ``patch`` applied (not stored); 415 for unknown patch types."""
        patcher = _PATCHERS.get(content_type)
        if patcher is None:
            raise _status.unsupported_media_type(_PATCHERS)
        if content_type != JSON_PATCH and not isinstance(patch, dict):
            raise _status.bad_request(
                "json: cannot unmarshal non-object into Go value of type map[string]interface {}"
            )
        try:
            result = patcher(full_object(resource, current), patch)
        except PatchError as exc:
            raise _status.patch_rejected(str(exc)) from exc
        if not isinstance(result, dict):
            raise _status.patch_rejected("the patched document is not an object")
        return result

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
        body = self.patched(resource, current, patch, content_type)
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
        _check_preconditions(resource, current, preconditions or {})
        if resource is _NAMESPACES:
            return self._terminate_namespace(current, dry_run=dry_run)
        if resource is _PODS:
            body = _graceful.terminating(current.decode(), grace_period_seconds, self._clock())
            if body is not None:
                if body == current.decode():
                    return current
                return self._commit(_PODS, MODIFIED, body, current, dry_run=dry_run)
        if dry_run:
            return current
        return self._commit(resource, DELETED, current.decode(), current)

    def _terminate_namespace(self, current: Entry, *, dry_run: bool) -> Entry:
        name = current.name
        if name in _UNDELETABLE_NAMESPACES:
            message = f'namespaces "{name}" is forbidden: this namespace may not be deleted'
            raise _status.failure(403, message, details={"name": name, "kind": "namespaces"})
        if _namespaces.is_terminating(current):
            raise _namespaces.already_terminating(_NAMESPACES, name)
        body = _namespaces.terminating(current.decode(), timestamp(self._clock()))
        entry = self._commit(_NAMESPACES, MODIFIED, body, current, dry_run=dry_run)
        if not dry_run:
            self._delete_namespace_contents(name)
            self._terminating.add(name)
        return entry

    def finalize_namespaces(self) -> None:
        """The namespace controller's pass: empty, finalize and release terminating namespaces."""
        for name in sorted(self._terminating):
            self._terminating.discard(name)
            current = self._objects["namespaces"].get(("", name))
            if current is None:
                continue
            self._delete_namespace_contents(name)
            body = _namespaces.finalized(current.decode())
            if body != current.decode():
                current = self._commit(_NAMESPACES, MODIFIED, body, current)
            if _namespaces.releasable(body):
                self._commit(_NAMESPACES, DELETED, current.decode(), current)

    def _delete_namespace_contents(self, namespace: str) -> None:
        for resource in RESOURCES:
            if resource.namespaced:
                for key in self._keys_in(resource, namespace, None):
                    entry = self._objects[resource.plural][key]
                    self._commit(resource, DELETED, entry.decode(), entry)

    def bind(self, namespace: str, name: str, binding: Mapping[str, Any]) -> Entry:
        """pods/binding: set spec.nodeName and merge the Binding's annotations in one write."""
        current = self.get(_PODS, namespace, name)
        meta = binding.get("metadata") or {}
        _check_preconditions(_PODS, current, meta)
        pod = current.decode()
        why = _unbindable(pod, name)
        if why:
            raise _status.conflict(_PODS, name, why, qualified="pods/binding")
        pod["spec"]["nodeName"] = (binding.get("target") or {}).get("name")
        annotations = meta.get("annotations") or {}
        if annotations:
            pod["metadata"]["annotations"] = {
                **(pod["metadata"].get("annotations") or {}),
                **annotations,
            }
        _set_condition(pod.setdefault("status", {}), "PodScheduled", timestamp(self._clock()))
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
        self._rv += 1
        self._revisions[resource.plural] = self._rv
        obj["metadata"]["resourceVersion"] = str(self._rv)
        entry = make_entry(resource, ordered(obj))
        table = self._objects[resource.plural]
        if kind == DELETED:
            del table[entry.key]
            self._sorted[resource.plural] = None
        else:
            if entry.key not in table:
                self._sorted[resource.plural] = None
            table[entry.key] = entry
        change = Change(resource, kind, entry, prev)
        self._logs[resource.plural].append(change)
        self.hub.dispatch(change)
        for observer in self._observers.get(resource.plural, ()):
            observer(change)
        if resource in (_PODS, _BUDGETS) and self._objects[_BUDGETS.plural]:
            self._sync_budgets(entry.namespace, None if resource is _BUDGETS else (entry, prev))
        return entry

    def _sync_budgets(self, namespace: str, pod: tuple[Entry, Entry | None] | None) -> None:
        """The disruption controller's pass, done at once after a write: over the budgets of
        the namespace that cover ``pod`` (before or after the write), or all of them after a
        budget's write. Like kube's controller it reads only the pods a budget selects, so a
        write costs the budget's live pods, not every pod the namespace ever had."""
        if self._syncing_budgets:
            return
        self._syncing_budgets = True
        try:
            for current in self._in_namespace(_BUDGETS, namespace):
                budget = current.decode()
                chosen = _disruption.selector(budget)
                if pod is None or any(_disruption.covers(chosen, e.labels) for e in pod if e):
                    self._sync_budget(budget, chosen, current)
        finally:
            self._syncing_budgets = False

    def _sync_budget(self, budget: JsonObj, chosen: LabelSelector | None, current: Entry) -> None:
        entries = self._in_namespace(_PODS, current.namespace)
        pods = [e.decode() for e in entries if _disruption.covers(chosen, e.labels) and _live(e)]
        status = _disruption.status(budget, pods, self._clock())
        if status != budget.get("status"):
            self._commit(_BUDGETS, MODIFIED, {**budget, "status": status}, current)

    def _in_namespace(self, resource: Resource, namespace: str) -> list[Entry]:
        table = self._objects[resource.plural]
        return [table[k] for k in self._keys_in(resource, namespace, None)]

    # -- faults ------------------------------------------------------------------------------

    def expire_before(self, resource_version: int | None) -> None:
        """Resuming a watch (or a paged list) from a version older than this gets 410."""
        floor = self._rv if resource_version is None else resource_version
        for log in self._logs.values():
            log.expire_before(floor)

    def entries(self, resource: Resource) -> Iterable[Entry]:
        return self._objects[resource.plural].values()


def _check_namespace(resource: Resource, namespace: str, meta: JsonObj) -> None:
    if not resource.namespaced:
        meta.pop("namespace", None)
        return
    given = meta.get("namespace")
    if given not in (None, "", namespace):
        raise _status.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    meta["namespace"] = namespace


def _check_preconditions(resource: Resource, current: Entry, wanted: Mapping[str, Any]) -> None:
    uid, rv = wanted.get("uid"), wanted.get("resourceVersion")
    if uid and uid != current.uid:
        raise _status.precondition_conflict(
            resource, current.namespace, current.name, "UID", uid, current.uid
        )
    if rv and str(rv) != str(current.rv):
        raise _status.precondition_conflict(
            resource, current.namespace, current.name, "ResourceVersion", str(rv), str(current.rv)
        )


def _unbindable(pod: JsonObj, name: str) -> str:
    """Why kube's binding storage refuses to assign ``pod`` to a node, or "" (in its order:
    a pending deletion first, then a node already set, then scheduling gates)."""
    if pod["metadata"].get("deletionTimestamp"):
        return f"pod {name} is being deleted, cannot be assigned to a host"
    node = pod["spec"].get("nodeName")
    if node:
        return f'pod {name} is already assigned to node "{node}"'
    if pod["spec"].get("schedulingGates"):
        return f"pod {name} has non-empty .spec.schedulingGates"
    return ""


def _set_condition(status: JsonObj, kind: str, now: str) -> None:
    condition = {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
    others = [c for c in status.get("conditions") or () if c.get("type") != kind]
    status["conditions"] = [*others, condition]


def _live(pod: Entry) -> bool:
    """Not finished: a finished pod counts toward no budget."""
    return pod.fields.get("status.phase") not in _disruption.TERMINAL
