"""A closer GPU is a faster GPU: servers are tried by how fine a topology domain (rack, then
zone, then region by default) they share with a client node, and the extender scores client
nodes by the same measure, so the rule (DESIGN §4) lives here once for both.

Domains are nested. A finer domain counts as shared only when every coarser domain known on
both sides is equal too: rack names are often reused across zones, and rack ``r1`` in zone
``b`` is not near rack ``r1`` in zone ``a``. A coarser label missing on either side does not
veto a shared finer one (nothing says they differ).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from rgpu_contracts import NodeName, ServerName

from ._fleetview import FleetView

__all__ = ["shared_level", "tiers"]


def _same(a: Mapping[str, str], b: Mapping[str, str], key: str) -> bool:
    return key in a and a.get(key) == b.get(key)


def _compatible(a: Mapping[str, str], b: Mapping[str, str], key: str) -> bool:
    return key not in a or key not in b or a[key] == b[key]


def _shares(a: Mapping[str, str], b: Mapping[str, str], keys: Sequence[str], level: int) -> bool:
    if not _same(a, b, keys[level]):
        return False
    return all(_compatible(a, b, k) for k in keys[level + 1 :])


def shared_level(a: Mapping[str, str], b: Mapping[str, str], keys: Sequence[str]) -> int | None:
    """The index in ``keys`` (finest first) of the finest domain ``a`` and ``b`` share under
    the nested rule, or ``None`` when they share none."""
    return next((level for level in range(len(keys)) if _shares(a, b, keys, level)), None)


def _profiles(view: FleetView, candidates: Iterable[NodeName]) -> list[dict[str, str]]:
    # Thousands of candidate nodes usually carry a handful of distinct label sets.
    seen: set[tuple[tuple[str, str], ...]] = set()
    for node in candidates:
        labels = view.node_labels.get(node) or {}
        seen.add(tuple(sorted((k, labels[k]) for k in view.topology_keys if k in labels)))
    return [dict(profile) for profile in sorted(seen) if profile]


def _near(view: FleetView, labels: Mapping[str, str], tier: int) -> Iterator[ServerName]:
    key = view.topology_keys[tier]
    value = labels.get(key)
    if value is None:
        return
    for server in view.by_label.get(key, {}).get(value, ()):
        if _shares(view.facts[server].labels, labels, view.topology_keys, tier):
            yield server


def tiers(view: FleetView, candidates: tuple[NodeName, ...]) -> dict[ServerName, int]:
    """Servers sharing a domain with a candidate node, mapped to the finest shared key's index.

    Servers absent from the result share nothing and rank after every listed one (their tier is
    ``len(view.topology_keys)``).
    """
    found: dict[ServerName, int] = {}
    profiles = _profiles(view, candidates)
    for tier in range(len(view.topology_keys)):
        for labels in profiles:
            for server in _near(view, labels, tier):
                found.setdefault(server, tier)
    return found
