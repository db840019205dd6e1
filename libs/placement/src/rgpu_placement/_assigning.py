"""Once a server is chosen, each container must be told which of the
pod's cards it sees, and that answer is stored in the claim so commit renders from it alone.

``server`` granularity: every requesting container sees all the pod's cards (lupine shows a
client every GPU of its server anyway). ``card`` granularity: app and sidecar containers get
disjoint slices in pod order; init containers run before them and reuse the first cards.
"""

from __future__ import annotations

from collections.abc import Sequence

from rgpu_contracts import Card, ContainerAssignment, ContainerKind, ContainerRequest

from ._fitting import Granularity

__all__ = ["assign"]


def _server_mode(
    containers: Sequence[ContainerRequest], cards: tuple[Card, ...]
) -> tuple[ContainerAssignment, ...]:
    ids = tuple(c.id for c in cards)
    return tuple(ContainerAssignment(name=c.name, cards=ids if c.count else ()) for c in containers)


def _card_mode(
    containers: Sequence[ContainerRequest], cards: tuple[Card, ...]
) -> tuple[ContainerAssignment, ...]:
    ids = tuple(c.id for c in cards)
    out: list[ContainerAssignment] = []
    offset = 0
    for c in containers:
        if c.kind is ContainerKind.INIT:
            out.append(ContainerAssignment(name=c.name, cards=ids[: c.count]))
            continue
        out.append(ContainerAssignment(name=c.name, cards=ids[offset : offset + c.count]))
        offset += c.count
    return tuple(out)


def assign(
    containers: Sequence[ContainerRequest], cards: tuple[Card, ...], granularity: Granularity
) -> tuple[ContainerAssignment, ...]:
    """The cards each container (in pod order) sees, from the pod's ``cards`` (index order)."""
    ordered = tuple(sorted(cards, key=lambda c: (c.index, c.id)))
    if granularity == "server":
        return _server_mode(containers, ordered)
    return _card_mode(containers, ordered)
