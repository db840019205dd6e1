"""Past states of a resource, rebuilt from the retained changes.

kube serves every page of a paged list, and a list with ``resourceVersionMatch=Exact``, from
etcd's MVCC history at one revision. The simulator keeps only the current objects plus the
retained change log, which is enough to roll the current state back: undo, newest first, every
change made after the wanted version. Rebuilding costs one pass over the table, so the few
most recent snapshots are cached (a client paging through a big list asks for the same one
page after page).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rgpu_kubesim.apiserver.storage._watching import Change
from rgpu_kubesim.machinery import Entry, Key

_CACHED = 4


@dataclass(frozen=True, slots=True)
class View:
    """A resource's objects at one version, with their keys in order."""

    table: Mapping[Key, Entry]
    keys: Sequence[Key]


def rolled_back(current: Mapping[Key, Entry], newer: Sequence[Change]) -> View:
    """``current`` with ``newer`` (the changes after some version, oldest first) undone."""
    table = dict(current)
    for change in reversed(newer):
        if change.prev is None:
            table.pop(change.entry.key, None)
        else:
            table[change.prev.key] = change.prev
    return View(table, sorted(table))


class Snapshots:
    """The last few rebuilt views, by (resource, version)."""

    def __init__(self) -> None:
        self._views: OrderedDict[tuple[str, int], View] = OrderedDict()

    def get(self, plural: str, rv: int, build: Callable[[], View]) -> View:
        key = (plural, rv)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = build()
            while len(self._views) > _CACHED:
                self._views.popitem(last=False)
        self._views.move_to_end(key)
        return view
