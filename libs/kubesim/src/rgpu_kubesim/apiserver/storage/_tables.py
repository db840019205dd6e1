"""The objects of the simulated cluster and the resourceVersion every write is stamped with.

One place holds every stored entry, the global version counter, each resource's last-written
version and retained change log, so that one `commit` does all a write must do at once: stamp
the next version, replace the entry, log the change and publish it (watchers first, then the
in-process observers). Nothing here knows what a kind means; the write path (`Storage`) and the
controllers decide what to commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rgpu_kubesim.apiserver.storage._listing import Listing
from rgpu_kubesim.apiserver.storage._watching import DELETED, Change, EventLog
from rgpu_kubesim.machinery import RESOURCES, Entry, Key, Resource, make_entry, ordered
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]
Observer = Callable[[Change], None]


class Tables:
    """Every entry by resource and key, versioned; see the module docstring."""

    def __init__(self, *, watch_window: int, publish: Observer) -> None:
        self._rv = 0
        self._objects: dict[str, dict[Key, Entry]] = {r.plural: {} for r in RESOURCES}
        self._sorted: dict[str, list[Key] | None] = {r.plural: [] for r in RESOURCES}
        self.logs = {r.plural: EventLog(watch_window, 0) for r in RESOURCES}
        self.listing = Listing(self._objects, self._sorted, self.logs, lambda: self._rv)
        self._revisions: dict[str, int] = {}
        self._publish = publish
        self._observers: dict[str, list[Observer]] = {}

    @property
    def resource_version(self) -> int:
        return self._rv

    def revision(self, resource: Resource) -> int:
        return self._revisions.get(resource.plural, 0)

    def observe(self, plural: str, observer: Observer) -> None:
        self._observers.setdefault(plural, []).append(observer)

    def get(self, resource: Resource, namespace: str, name: str) -> Entry:
        entry = self.find(resource, namespace, name)
        if entry is None:
            raise _status.not_found(resource, name)
        return entry

    def find(self, resource: Resource, namespace: str, name: str) -> Entry | None:
        return self._objects[resource.plural].get((namespace, name))

    def entries(self, resource: Resource) -> Iterable[Entry]:
        return self._objects[resource.plural].values()

    def has_any(self, resource: Resource) -> bool:
        return bool(self._objects[resource.plural])

    def at(self, resource: Resource, key: Key) -> Entry:
        return self._objects[resource.plural][key]

    def keys_in(self, resource: Resource, namespace: str | None) -> list[Key]:
        """The keys in ``namespace`` (None: all) in order."""
        return self.listing.keys_in(resource, namespace, None)

    def in_namespace(self, resource: Resource, namespace: str | None) -> list[Entry]:
        """The entries of ``namespace`` (None: all) in key order."""
        table = self._objects[resource.plural]
        return [table[k] for k in self.keys_in(resource, namespace)]

    def commit(self, resource: Resource, kind: str, obj: JsonObj, prev: Entry | None) -> Entry:
        """Store ``obj`` (or drop it, for DELETED) at the next resourceVersion and publish it."""
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
        self.logs[resource.plural].append(change)
        self._publish(change)
        for observer in self._observers.get(resource.plural, ()):
            observer(change)
        return entry

    def expire_before(self, resource_version: int | None) -> None:
        floor = self._rv if resource_version is None else resource_version
        for log in self.logs.values():
            log.expire_before(floor)
