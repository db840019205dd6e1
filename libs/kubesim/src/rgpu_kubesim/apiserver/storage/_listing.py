"""Reading lists: pages in key order, at the current version or a retained past one.

A list is served from one version: the newest, or the one named by ``resourceVersionMatch=
Exact`` or by a continue token. Past versions are rebuilt from the retained change log
(`_history`); a version older than the log is 410 Expired, as after etcd compaction.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence

from rgpu_kubesim.apiserver.storage._history import Snapshots, View, rolled_back
from rgpu_kubesim.apiserver.storage._paging import (
    LATEST,
    ListPage,
    continue_expired,
    decode_continue,
    encode_continue,
    list_too_old,
    parse_resource_version,
)
from rgpu_kubesim.apiserver.storage._watching import EventLog
from rgpu_kubesim.machinery import Entry, Filter, Key, Resource
from rgpu_kubesim.machinery import status as _status


class Listing:
    """Lists over the storage's tables (shared, not copied) and change logs."""

    def __init__(
        self,
        objects: Mapping[str, Mapping[Key, Entry]],
        sorted_keys: dict[str, list[Key] | None],
        logs: Mapping[str, EventLog],
        current: Callable[[], int],
    ) -> None:
        self._objects = objects
        self._sorted = sorted_keys
        self._logs = logs
        self._current = current
        self._snapshots = Snapshots()

    def page(
        self,
        resource: Resource,
        wanted: Filter,
        *,
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
        match: str = "",
    ) -> ListPage:
        """Entries in key order; ``limit``/``continue_token`` page through them.

        Every page comes from the state at the first page's resourceVersion, as kube's pages
        come from one etcd revision; so does a list at ``resourceVersionMatch=Exact``.
        """
        rv, start = self._start(resource, continue_token, resource_version, match, limit)
        view = self.view(resource, rv)
        keys = _window(view.keys, resource, wanted.namespace, start)
        chosen: list[Entry] = []
        for index, key in enumerate(keys):
            entry = view.table[key]
            if wanted.admits(entry.namespace, entry.labels, entry.fields):
                if limit and len(chosen) == limit:
                    token = encode_continue(rv, chosen[-1].key)
                    remaining = None if wanted.labels or wanted.fields else len(keys) - index
                    return ListPage(
                        entries=tuple(chosen), rv=rv, continue_token=token, remaining=remaining
                    )
                chosen.append(entry)
        return ListPage(entries=tuple(chosen), rv=rv)

    def _start(
        self, resource: Resource, token: str, resource_version: str, match: str, limit: int
    ) -> tuple[int, Key | None]:
        if token:
            if resource_version not in ("", "0"):
                raise _status.bad_request(
                    "specifying resource version is not allowed when using continue"
                )
            rv, start = decode_continue(token)
            if rv == LATEST:
                return self._current(), start
            if rv < self._logs[resource.plural].oldest_resumable():
                raise continue_expired(encode_continue(LATEST, start))
            return rv, start
        return self._version(resource, resource_version, match, limit), None

    def _version(self, resource: Resource, resource_version: str, match: str, limit: int) -> int:
        if resource_version in ("", "0"):
            return self._current()
        requested = parse_resource_version(resource_version)
        if requested > self._current():
            raise _status.too_large(requested, self._current())
        # Without a match, a paged list at a version is exact (kube's legacy rule).
        if match == "Exact" or (not match and limit):
            if requested < self._logs[resource.plural].oldest_resumable():
                raise list_too_old()
            return requested
        return self._current()

    def view(self, resource: Resource, rv: int) -> View:
        table = self._objects[resource.plural]
        newer = self._logs[resource.plural].since(rv) if rv < self._current() else []
        if not newer:
            return View(table, self._sorted_keys(resource))
        return self._snapshots.get(resource.plural, rv, lambda: rolled_back(table, newer))

    def _sorted_keys(self, resource: Resource) -> list[Key]:
        keys = self._sorted[resource.plural]
        if keys is None:
            keys = self._sorted[resource.plural] = sorted(self._objects[resource.plural])
        return keys

    def keys_in(self, resource: Resource, namespace: str | None, after: Key | None) -> list[Key]:
        return list(_window(self._sorted_keys(resource), resource, namespace, after))


def _window(
    keys: Sequence[Key], resource: Resource, namespace: str | None, after: Key | None
) -> Sequence[Key]:
    low, high = 0, len(keys)
    if namespace is not None and resource.namespaced:
        low = bisect.bisect_left(keys, (namespace, ""))
        high = bisect.bisect_left(keys, (namespace + "\x00", ""))
    if after is not None:
        low = max(low, bisect.bisect_right(keys, after))
    return keys[low:high]
