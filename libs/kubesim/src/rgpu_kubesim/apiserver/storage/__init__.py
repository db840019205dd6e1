"""The storage engine (objects, resourceVersions, watches, lists and pages) and ``Store``,
its in-process face for tests and the demo.
"""

from __future__ import annotations

from rgpu_kubesim.apiserver.storage._paging import (
    ListPage,
)
from rgpu_kubesim.apiserver.storage._storage import (
    Storage,
    WatchStart,
)
from rgpu_kubesim.apiserver.storage._store import (
    Store,
)
from rgpu_kubesim.apiserver.storage._watching import (
    ADDED,
    INITIAL_EVENTS_END,
    Change,
    event_line,
)

__all__ = [
    "ADDED",
    "INITIAL_EVENTS_END",
    "Change",
    "ListPage",
    "Storage",
    "Store",
    "WatchStart",
    "event_line",
]
