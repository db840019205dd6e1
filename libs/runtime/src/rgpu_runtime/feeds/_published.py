"""Every publisher of a feed (discovery's fleet and topology, the allocator's claims) answers
the same three ways, and must build them the same way.

A feed is read far more often than it changes (every long-poll waiter wakes on each change),
and a 5,000-server fleet takes tens of milliseconds to serialise. A ``Published`` snapshot
therefore keeps each entry's JSON from the moment the entry was built, and joins them once per
revision, however many readers ask.

Most changes touch one entry, and a follower that already holds the value needs only that
entry: a snapshot built from its predecessor (``previous``) knows which entries changed since
(its ``Changelog``, bounded), and answers an update — only the entries changed or removed
since the revision a follower holds (laid out as the feed declares, ``DeltaLayout``), the
whole set marked ``full`` when that revision is older than the log, or ``behind`` when the
follower holds a revision this snapshot has not reached. Update bodies are built from the same
cached entry JSON, once per ``since`` however many followers ask from it.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import orjson

from ._changelog import Changelog, Changes
from ._feed import DeltaLayout, Feed
from ._longpoll import Poll

__all__ = ["GZIP_LEVEL", "UPDATES_KEPT", "Entry", "Published", "gzip_body", "initial_revision"]

GZIP_LEVEL: Final = 3
"""As fast as level 1 on this repetitive JSON (about 13 ms for a 10 MB fleet) and a quarter
smaller; higher levels cost twice the time for a few percent."""

UPDATES_KEPT: Final = 16
"""Update bodies kept per snapshot, one per ``since`` asked: followers of one publisher hold
one of a few recent revisions."""

V = TypeVar("V")


def initial_revision() -> int:
    """A starting revision above any this replica published before it restarted.

    Milliseconds since the epoch: a restarted replica never reuses a revision its clients
    already hold, so a long-poll never mistakes a new value for one it has seen.
    """
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry(Generic[V]):
    """One named entry and its JSON, encoded once when the entry was built."""

    name: str
    value: V
    json: bytes
    """The entry's JSON as it stands in the body's list (for the claims, one server's claims
    as array elements without the brackets)."""

    @classmethod
    def of(cls, name: str, value: V, to_dict: Callable[[V], object]) -> Entry[V]:
        """Wrap ``value`` with its encoded ``to_dict``."""
        return cls(name=name, value=value, json=orjson.dumps(to_dict(value)))


class Published(Generic[V]):
    """An immutable snapshot of ``feed``: a revision, top-level ``fields`` and the entries
    listed under the feed's key.

    ``listed`` is false until the publisher first has the value (discovery's first Node
    list), so readers can tell "nothing" from "not known yet". Sorting and the joined JSON are
    computed on first use and then reused (the content never changes, so the memo is safe).
    ``previous`` (the snapshot this one replaces) starts the changelog and is not kept: what
    changed since it is ``changes`` when the publisher knows (the allocator's Lease watch
    names the one server), else found by comparing the entries once.
    """

    __slots__ = (
        "_body",
        "_by_name",
        "_feed",
        "_fields",
        "_full",
        "_full_gzipped",
        "_gzipped",
        "_updates",
        "_values",
        "changelog",
        "listed",
        "revision",
    )

    def __init__(
        self,
        feed: Feed[Any],
        *,
        revision: int,
        listed: bool = True,
        fields: Mapping[str, object] | None = None,
        entries: Mapping[str, Entry[V]] | Iterable[Entry[V]],
        previous: Published[V] | None = None,
        changes: Changes | None = None,
    ) -> None:
        self.revision = revision
        self.listed = listed
        self._feed = feed
        self._fields = {"revision": revision, **(fields or {})}
        self._by_name: dict[str, Entry[V]] = (
            dict(entries) if isinstance(entries, Mapping) else {item.name: item for item in entries}
        )
        self._values: tuple[V, ...] | None = None
        self._body: bytes | None = None
        self._gzipped: bytes | None = None
        self._full: bytes | None = None
        self._full_gzipped: bytes | None = None
        self._updates: dict[int, bytes] = {}
        self.changelog = _changelog(self, previous, changes)
        """Which entries each recent revision changed, up to this one."""

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def fields(self) -> Mapping[str, object]:
        """The top-level JSON fields besides the list (``revision`` included)."""
        return self._fields

    @property
    def values(self) -> tuple[V, ...]:
        """The entries' values, sorted by name."""
        if self._values is None:
            self._values = tuple(item.value for item in self._sorted())
        return self._values

    def answer(self, poll: Poll) -> bytes:
        """The body for ``poll``: the whole value unless it asked for updates of a feed that
        has them; then ``behind`` when this snapshot is below the client's ``since``, else
        the update since it."""
        if not poll.delta or self._feed.updates is None:
            return self.body()
        if poll.since is not None and poll.behind(self.revision):
            return self.behind(poll.since)
        return self.update(poll.since)

    def body(self) -> bytes:
        """The whole snapshot as JSON: the fields, then the sorted list under the feed's key."""
        if self._body is None:
            head = orjson.dumps(self._fields)[:-1]
            entries = b",".join(item.json for item in self._sorted())
            self._body = b'%s,"%s":[%s]}' % (head, self._feed.key.encode(), entries)
        return self._body

    def gzipped(self) -> bytes:
        """``body()`` gzip-compressed, once: fleet JSON shrinks about 20x, and every waiter
        woken by a change downloads it, so the bytes on the wire are what fan-out costs."""
        if self._gzipped is None:
            self._gzipped = gzip_body(self.body())
        return self._gzipped

    def compressed(self, body: bytes) -> bytes:
        """``body`` (one of this snapshot's answers) gzip-compressed; the whole-set answers
        once per snapshot, since every new follower downloads one."""
        if body is self.body():
            return self.gzipped()
        if body is not self.full_update():
            return gzip_body(body)
        if self._full_gzipped is None:
            self._full_gzipped = gzip_body(body)
        return self._full_gzipped

    def full_update(self) -> bytes:
        """``body()`` as an update of kind ``full``."""
        if self._full is None:
            self._full = b'{"kind":"full",' + self.body()[1:]
        return self._full

    def update(self, since: int | None) -> bytes:
        """The update for a reader holding ``since`` (not above ``revision``): the entries
        changed and removed since then, or ``full_update()`` when the log does not reach
        back to ``since``."""
        changes = None if since is None else self.changelog.since(since)
        if since is None or changes is None:
            return self.full_update()
        body = self._updates.get(since)
        if body is None:
            body = self._delta(since, changes)
            if len(self._updates) >= UPDATES_KEPT:
                del self._updates[next(iter(self._updates))]
            self._updates[since] = body
        return body

    def behind(self, since: int) -> bytes:
        """The update telling a reader holding ``since`` that this snapshot is older."""
        return orjson.dumps({"kind": "behind", **self._fields, "since": since})

    def _delta(self, since: int, changes: Changes) -> bytes:
        head = orjson.dumps({"kind": "delta", **self._fields, "since": since})[:-1]
        key = self._feed.key.encode()
        if self._feed.delta is DeltaLayout.GROUPED:
            names = sorted(changes.changed | changes.removed)
            entries = b",".join(self._by_name[n].json for n in names if n in self._by_name)
            return b'%s,"servers":%s,"%s":[%s]}' % (head, orjson.dumps(names), key, entries)
        changed = sorted((self._by_name[name] for name in changes.changed), key=_name)
        entries = b",".join(item.json for item in changed)
        removed = orjson.dumps(sorted(changes.removed))
        return b'%s,"%s":[%s],"removed":%s}' % (head, key, entries, removed)

    def _sorted(self) -> list[Entry[V]]:
        return sorted(self._by_name.values(), key=_name)


def gzip_body(body: bytes) -> bytes:
    """``body`` gzip-compressed the way every answer is (level 3, no timestamp)."""
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


def _name(item: Entry[V]) -> str:
    return item.name


def _changelog(
    snapshot: Published[V], previous: Published[V] | None, changes: Changes | None
) -> Changelog:
    """``previous``'s changelog followed by what ``snapshot`` changed (``changes``, or what
    comparing the entries finds); a fresh one (nothing to tell) without a predecessor, or when
    revisions did not move forward."""
    if previous is None or snapshot.revision <= previous.revision:
        return Changelog(snapshot.revision)
    if changes is not None:
        return previous.changelog.then(snapshot.revision, changes.changed, changes.removed)
    before, after = previous._by_name, snapshot._by_name
    changed = [name for name, item in after.items() if _differs(before.get(name), item)]
    removed = [name for name in before if name not in after]
    return previous.changelog.then(snapshot.revision, changed, removed)


def _differs(before: Entry[V] | None, after: Entry[V]) -> bool:
    return before is None or (before is not after and before.json != after.json)
