"""A closer GPU is a faster GPU, so servers are tried by how fine a
topology domain (rack, then zone, then region by default) they share with at least one of the
client nodes kube-scheduler is still considering for the pod.
"""

from __future__ import annotations

from collections.abc import Iterable

from rgpu_contracts import NodeName, ServerName

from .fleetview import FleetView

__all__ = ["tiers"]


def _domains(view: FleetView, candidates: Iterable[NodeName], key: str) -> set[str]:
    found: set[str] = set()
    for node in candidates:
        labels = view.node_labels.get(node)
        value = labels.get(key) if labels is not None else None
        if value is not None:
            found.add(value)
    return found


def tiers(view: FleetView, candidates: tuple[NodeName, ...]) -> dict[ServerName, int]:
    """Servers sharing a domain with a candidate node, mapped to the finest shared key's index.

    Servers absent from the result share nothing and rank after every listed one (their tier is
    ``len(view.topology_keys)``).
    """
    found: dict[ServerName, int] = {}
    if not candidates:
        return found
    for tier, key in enumerate(view.topology_keys):
        by_value = view.by_label.get(key, {})
        for value in _domains(view, candidates, key):
            for server in by_value.get(value, ()):
                found.setdefault(server, tier)
    return found
