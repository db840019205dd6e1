"""The allocator and the extender judge locality from client nodes'
topology labels, and neither should watch every Node for it. Discovery already sees every
Node, so it keeps the configured topology labels of each client node and publishes them
with their own revision, which moves only when a node appears, disappears, or one of those
labels changes (a heartbeat or an unrelated relabel moves nothing).
"""

from __future__ import annotations

from collections.abc import Iterable

from rgpu_contracts.ids import NodeName
from rgpu_contracts.topology import NodeTopology, Topology
from rgpu_runtime.feeds import TOPOLOGY_FEED, Entry, Published, Versioned, initial_revision

from .nodes import NodeView

__all__ = ["TopologySnapshot", "TopologyState"]

TopologySnapshot = Published[NodeTopology]


class TopologyState:
    """Client nodes' topology labels and their long-poll."""

    def __init__(self) -> None:
        self._items: dict[NodeName, Entry[NodeTopology]] = {}
        empty = TopologySnapshot(
            TOPOLOGY_FEED, revision=initial_revision(), listed=False, entries=()
        )
        self.published: Versioned[TopologySnapshot] = Versioned(empty, revision=empty.revision)

    def snapshot(self) -> TopologySnapshot:
        """The latest published topology."""
        return self.published.value

    def topology(self) -> Topology:
        """The latest topology as the wire contract."""
        snap = self.published.value
        return Topology(revision=snap.revision, nodes=snap.values)

    def apply(self, view: NodeView) -> bool:
        """Add or update client node ``view``; publishes when its labels changed."""
        changed = self._store(view)
        if changed:
            self._publish()
        return changed

    def remove(self, name: NodeName) -> bool:
        """Forget a node (deleted, or now a server); publishes when it was known."""
        if self._items.pop(name, None) is None:
            return False
        self._publish()
        return True

    def replace_all(self, views: Iterable[NodeView]) -> None:
        """Make the topology exactly ``views`` (a full list); publishes once if anything changed."""
        listed = {view.name: view for view in views}
        gone = self._items.keys() - listed.keys()
        for name in gone:
            del self._items[name]
        changed = [self._store(view) for view in listed.values()]
        if gone or any(changed) or not self.published.value.listed:
            self._publish()

    def _store(self, view: NodeView) -> bool:
        old = self._items.get(view.name)
        if old is not None and old.value.labels == view.topology:
            return False
        node = NodeTopology(name=view.name, labels=view.topology)
        self._items[view.name] = Entry.of(view.name, node, NodeTopology.to_dict)
        return True

    def _publish(self) -> None:
        snapshot = TopologySnapshot(
            TOPOLOGY_FEED, revision=self.published.revision + 1, entries=self._items.values()
        )
        self.published.publish(snapshot)
