"""Watch machinery: the retained event window, per-watcher filtering and bounded fan-out.

Every committed write becomes one `Change`. Each resource keeps the last ``watch_window``
changes so a watch can resume from a resourceVersion (older ones get ``410 Expired``, as
after etcd compaction). Live changes are offered to every open `Watcher` synchronously by the
writer; a watcher only appends pre-encoded lines to a bounded buffer, so a slow client can
never stall a writer: when its buffer is full it is cut, and the client relists/rewatches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import anyio

from rgpu_kubesim.machinery import Entry, Filter, Resource, full_bytes, with_resource_version
from rgpu_kubesim.machinery import status as _status

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def event_line(kind: str, object_bytes: bytes) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (kind.encode(), object_bytes)


class Change:
    """One committed write; encodes each event line at most once for all watchers."""

    __slots__ = ("_lines", "entry", "kind", "prev", "resource")

    def __init__(self, resource: Resource, kind: str, entry: Entry, prev: Entry | None) -> None:
        self.resource = resource
        self.kind = kind
        self.entry = entry
        self.prev = prev
        self._lines: dict[str, bytes] = {}

    @property
    def rv(self) -> int:
        return self.entry.rv

    def line(self, kind: str) -> bytes:
        """The event line for this change as seen by a watcher that gets it as ``kind``."""
        cached = self._lines.get(kind)
        if cached is None:
            cached = self._lines[kind] = event_line(
                kind, full_bytes(self.resource, self._body_for(kind))
            )
        return cached

    def _body_for(self, kind: str) -> Entry:
        if kind == DELETED and self.kind == MODIFIED and self.prev is not None:
            # kube sends the last matching content, stamped with the version that unmatched it.
            return with_resource_version(self.resource, self.prev, self.entry.rv)
        return self.entry


class EventLog:
    """The retained changes of one resource, oldest first."""

    def __init__(self, window: int, start_rv: int) -> None:
        self._changes: deque[Change] = deque(maxlen=max(window, 1))
        self._base = start_rv
        self._floor = 0

    def append(self, change: Change) -> None:
        if len(self._changes) == self._changes.maxlen:
            self._base = self._changes[0].rv
        self._changes.append(change)

    def expire_before(self, rv: int) -> None:
        self._floor = max(self._floor, rv)

    def oldest_resumable(self) -> int:
        """The smallest resourceVersion a watch may resume from."""
        return max(self._base, self._floor)

    def check(self, rv: int) -> None:
        oldest = self.oldest_resumable()
        if rv < oldest:
            raise _status.too_old(rv, oldest)

    def since(self, rv: int) -> list[Change]:
        """Changes after ``rv``; raises 410 Expired when some were already dropped."""
        self.check(rv)
        return [c for c in self._changes if c.rv > rv]


class Watcher:
    """One open watch: its filter, its pending lines and whether it has been cut."""

    def __init__(
        self, resource: Resource, wanted: Filter, *, capacity: int, audit: bool = False
    ) -> None:
        self.resource = resource
        self.wanted = wanted
        self.capacity = capacity
        self.audit = audit
        """An auditor's watch (a verdict's evidence): neither faults nor a full buffer cut it,
        so what it records is complete whatever the clients under test went through."""
        self.closed = False
        self._pending: deque[bytes] = deque()
        self._wake = anyio.Event()

    def matches(self, entry: Entry | None) -> bool:
        return entry is not None and self.wanted.admits(entry.namespace, entry.labels, entry.fields)

    def kind_for(self, change: Change) -> str | None:
        """How this watcher sees ``change``: kube turns filter transitions into ADDED/DELETED."""
        if change.kind != MODIFIED:
            return change.kind if self.matches(change.entry) else None
        now, before = self.matches(change.entry), self.matches(change.prev)
        if now:
            return MODIFIED if before else ADDED
        return DELETED if before else None

    def replay(self, changes: Iterable[Change]) -> Iterator[bytes]:
        for change in changes:
            kind = self.kind_for(change)
            if kind is not None:
                yield change.line(kind)

    def offer(self, change: Change) -> None:
        if self.closed:
            return
        kind = self.kind_for(change)
        if kind is None:
            return
        if len(self._pending) >= self.capacity and not self.audit:
            self.close()
            return
        self._pending.append(change.line(kind))
        self._wake.set()

    def close(self) -> None:
        """Cut the watch: pending lines are dropped, the client resumes from what it saw."""
        self.closed = True
        self._pending.clear()
        self._wake.set()

    async def take(self, timeout: float) -> list[bytes]:
        """Wait up to ``timeout`` seconds for lines; empty when none came or the watch closed."""
        if not self._pending and not self.closed:
            self._wake = anyio.Event()
            with anyio.move_on_after(max(timeout, 0)):
                await self._wake.wait()
        lines = list(self._pending)
        self._pending.clear()
        return lines


class WatchHub:
    """Every open watcher, by resource; dispatches each change to the relevant ones."""

    def __init__(self) -> None:
        self._watchers: dict[str, set[Watcher]] = {}

    def add(self, watcher: Watcher) -> None:
        self._watchers.setdefault(watcher.resource.plural, set()).add(watcher)

    def remove(self, watcher: Watcher) -> None:
        self._watchers.get(watcher.resource.plural, set()).discard(watcher)

    def dispatch(self, change: Change) -> None:
        for watcher in tuple(self._watchers.get(change.resource.plural, ())):
            watcher.offer(change)

    def cut_all(self) -> None:
        for watchers in self._watchers.values():
            for watcher in tuple(watchers):
                if not watcher.audit:
                    watcher.close()

    def count(self) -> int:
        return sum(len(w) for w in self._watchers.values())
