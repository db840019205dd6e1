"""A closer GPU is a faster GPU: servers are tried by how fine a topology domain (rack, then
zone, then region by default) they share with a client node, and the extender scores client
nodes by the same measure, so the rule (DESIGN §4) lives here once for both.

Domains are nested. A finer domain counts as shared only when every coarser domain known on
both sides is equal too: rack names are often reused across zones, and rack ``r1`` in zone
``b`` is not near rack ``r1`` in zone ``a``. A coarser label missing on either side does not
veto a shared finer one (nothing says they differ).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rgpu_contracts import NodeName, ServerName

from ._fleetview import FleetView

__all__ = ["shared_level", "tiers"]

_Domain = tuple[tuple[str, str], ...]
"""A domain as ``(key, value)`` pairs, finest key first."""


def _same(a: Mapping[str, str], b: Mapping[str, str], key: str) -> bool:
    return key in a and a.get(key) == b.get(key)


def _compatible(a: Mapping[str, str], b: Mapping[str, str], key: str) -> bool:
    return key not in a or key not in b or a[key] == b[key]


def _agree(a: Mapping[str, str], b: Mapping[str, str], keys: Sequence[str]) -> bool:
    return all(_compatible(a, b, k) for k in keys)


def _shares(a: Mapping[str, str], b: Mapping[str, str], keys: Sequence[str], level: int) -> bool:
    return _same(a, b, keys[level]) and _agree(a, b, keys[level + 1 :])


def shared_level(a: Mapping[str, str], b: Mapping[str, str], keys: Sequence[str]) -> int | None:
    """The index in ``keys`` (finest first) of the finest domain ``a`` and ``b`` share under
    the nested rule, or ``None`` when they share none."""
    return next((level for level in range(len(keys)) if _shares(a, b, keys, level)), None)


def _profiles(view: FleetView, candidates: Iterable[NodeName]) -> list[dict[str, str]]:
    # Thousands of candidate nodes usually carry a handful of distinct label sets.
    keys = view.topology_keys
    seen: set[tuple[str | None, ...]] = set()
    for node in candidates:
        labels = view.node_labels.get(node)
        if labels:
            seen.add(tuple(labels.get(k) for k in keys))
    return [{k: v for k, v in zip(keys, p, strict=True) if v is not None} for p in seen]


def _domains(profiles: Iterable[Mapping[str, str]], keys: Sequence[str], tier: int) -> set[_Domain]:
    # Candidates differing only in finer labels share the same domain at this tier.
    return {
        tuple((k, labels[k]) for k in keys[tier:] if k in labels)
        for labels in profiles
        if keys[tier] in labels
    }


def _near(view: FleetView, domain: _Domain) -> set[ServerName]:
    """Servers in ``domain`` under the nested rule: the same value of its first (finest) key,
    and on every coarser key it names, the same value or no label at all."""
    (key, value), *coarser = domain
    near: Iterable[ServerName] = view.by_label.get(key, {}).get(value, frozenset())
    for key, value in coarser:
        same = view.by_label.get(key, {}).get(value, frozenset())
        unlabelled = view.unlabelled[key]
        near = [s for s in near if s in same or s in unlabelled]
    return set(near)


def tiers(view: FleetView, candidates: tuple[NodeName, ...]) -> dict[ServerName, int]:
    """Servers sharing a domain with a candidate node, mapped to the finest shared key's index
    (the same answer as the best ``shared_level`` over the candidates, computed over sets).

    Servers absent from the result share nothing and rank after every listed one (their tier is
    ``len(view.topology_keys)``).
    """
    found: dict[ServerName, int] = {}
    profiles = _profiles(view, candidates)
    for tier in range(len(view.topology_keys)):
        near = set().union(*(_near(view, d) for d in _domains(profiles, view.topology_keys, tier)))
        found.update(dict.fromkeys(near.difference(found), tier))
    return found
