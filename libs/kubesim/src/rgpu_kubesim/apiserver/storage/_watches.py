"""Opening and closing watches: where a new watch starts and who hears each change.

A watch starts from the current state (sent as ADDED lines), or replays the retained change
log from the version it asks for; one that asks for a version this server has not reached is
refused, as kube-apiserver refuses it. Every open watcher sits in one `WatchHub`, which the
tables publish each committed change to.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rgpu_kubesim.apiserver.storage._paging import parse_resource_version
from rgpu_kubesim.apiserver.storage._tables import Tables
from rgpu_kubesim.apiserver.storage._watching import ADDED, Watcher, WatchHub, event_line
from rgpu_kubesim.machinery import Filter, Resource, full_bytes
from rgpu_kubesim.machinery import status as _status


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchStart:
    """An opened watch: the registered watcher and the lines to send before live events."""

    watcher: Watcher
    initial: Iterator[bytes]
    rv: int


class Watches:
    """The open watches over ``tables``; their hub is what the tables publish to."""

    def __init__(self, tables: Tables, hub: WatchHub, *, capacity: int) -> None:
        self._tables = tables
        self.hub = hub
        self._capacity = capacity

    def open(
        self,
        resource: Resource,
        wanted: Filter,
        *,
        resource_version: str,
        send_initial: bool,
        audit: bool,
    ) -> WatchStart:
        watcher = Watcher(resource, wanted, capacity=self._capacity, audit=audit)
        current = self._tables.resource_version
        if send_initial or resource_version in ("", "0"):
            if resource_version not in ("", "0"):
                # A streaming list at a version not older than one this server has not reached.
                _check_reached(parse_resource_version(resource_version), current)
            initial = self._state_lines(resource, watcher)
        else:
            requested = parse_resource_version(resource_version)
            _check_reached(requested, current)
            log = self._tables.logs[resource.plural]
            initial = iter(list(watcher.replay(log.since(requested))))
        self.hub.add(watcher)
        return WatchStart(watcher=watcher, initial=initial, rv=current)

    def _state_lines(self, resource: Resource, watcher: Watcher) -> Iterator[bytes]:
        snapshot = self._tables.in_namespace(resource, watcher.wanted.namespace)
        return (event_line(ADDED, full_bytes(resource, e)) for e in snapshot if watcher.matches(e))

    def close(self, watcher: Watcher) -> None:
        watcher.close()
        self.hub.remove(watcher)


def _check_reached(requested: int, current: int) -> None:
    if requested > current:
        raise _status.too_large(requested, current)
