"""A closer GPU is a faster GPU: servers are tried by how fine a topology domain (rack, then
zone, then region by default) they share with a client node, and the extender scores client
nodes by the same measure, so the rule (docs/design.md#choosing-a-server) lives here once for both.

Domains are nested. A finer domain counts as shared only when every coarser domain known on
both sides is equal too: rack names are often reused across zones, and rack ``r1`` in zone
``b`` is not near rack ``r1`` in zone ``a``. A coarser label missing on either side does not
veto a shared finer one (nothing says they differ).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rgpu_contracts import NodeName, ServerName

from ._fleetview import FleetView, Path, path_of

__all__ = ["shared_level", "tiers"]


def _agreeing(a: Path, b: Path) -> bool:
    # Domains known on both sides must be equal; one side not knowing one vetoes nothing.
    return all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def _shares(a: Path, b: Path, level: int) -> bool:
    return (
        a[level] is not None and a[level] == b[level] and _agreeing(a[level + 1 :], b[level + 1 :])
    )


def shared_level(a: Mapping[str, str], b: Mapping[str, str], keys: Sequence[str]) -> int | None:
    """The index in ``keys`` (finest first) of the finest domain ``a`` and ``b`` share under
    the nested rule, or ``None`` when they share none."""
    pa, pb = path_of(a, keys), path_of(b, keys)
    return next((level for level in range(len(keys)) if _shares(pa, pb, level)), None)


def _profiles(view: FleetView, candidates: Iterable[NodeName]) -> set[Path]:
    # Thousands of candidate nodes usually carry a handful of distinct label sets.
    keys = view.topology_keys
    return {path_of(view.node_labels.get(node) or {}, keys) for node in candidates}


def _domains(profiles: Iterable[Path], tier: int) -> set[tuple[str, Path]]:
    """The candidates' values of the key at ``tier``, each with the coarser labels beside it."""
    found: set[tuple[str, Path]] = set()
    for path in profiles:
        value = path[tier]
        if value is not None:
            found.add((value, path[tier + 1 :]))
    return found


def _near(view: FleetView, tier: int, value: str, coarser: Path) -> set[ServerName]:
    """Servers sharing the domain ``value`` of ``keys[tier]`` with a candidate whose coarser
    labels are ``coarser``, under the nested rule (compared per distinct label set)."""
    near: set[ServerName] = set()
    for server_coarser, servers in view.domains[tier].get(value, {}).items():
        if _agreeing(server_coarser, coarser):
            near |= servers
    return near


def tiers(view: FleetView, candidates: tuple[NodeName, ...]) -> dict[ServerName, int]:
    """Servers sharing a domain with a candidate node, mapped to the finest shared key's index
    (the same answer as the best ``shared_level`` over the candidates, over distinct label sets).

    Servers absent from the result share nothing and rank after every listed one (their tier is
    ``len(view.topology_keys)``).
    """
    found: dict[ServerName, int] = {}
    profiles = _profiles(view, candidates)
    for tier in range(len(view.topology_keys)):
        near = set().union(*(_near(view, tier, v, up) for v, up in _domains(profiles, tier)))
        found.update(dict.fromkeys(near.difference(found), tier))
    return found
