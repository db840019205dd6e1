"""The storage engine and ``Store``, its in-process face for tests and the demo.

``Storage`` is the one door to the objects; behind it, by concern: the versioned tables and the
one commit that publishes a change (``_tables``), the open watches and where each starts
(``_watches``, over the hub and event logs of ``_watching``), lists and pages at a current or
past version (``_listing``, ``_history``, ``_paging``), and the namespace and disruption
controllers that run inside a write (``_controllers``).
"""

from __future__ import annotations

from rgpu_kubesim.apiserver.storage._paging import (
    ListPage,
)
from rgpu_kubesim.apiserver.storage._storage import Storage
from rgpu_kubesim.apiserver.storage._store import (
    Store,
)
from rgpu_kubesim.apiserver.storage._watches import WatchStart
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
