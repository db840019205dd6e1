"""A claim is rebuilt from a pod's ``hami.io/remote-gpu-devices-allocated`` annotation only
when rgpu could have given exactly that for the pod's own demand on the current fleet: these
are the rules, pure functions of the pod and the fleet (``repair`` applies them).

``server`` granularity: every healthy card of one server, each ask fitting; ``card``: the
effective count of cards of one server, each large enough; and per container the cards
``rgpu_placement.assign`` gives. Anything else is ``Untrusted``, with a sentence saying why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    Card,
    CardId,
    Claim,
    ClaimState,
    ContainerAssignment,
    ContractError,
    NodeName,
    decode_devices,
    split_card_id,
)
from rgpu_placement import (
    Demand,
    FleetView,
    Granularity,
    InvalidQuantity,
    ServerFacts,
    assign,
    demand_of,
    read_demand,
)
from rgpu_runtime.settings import ResourceSettings

from .pods import PodInfo

__all__ = ["Untrusted", "vet"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Untrusted:
    """Why a pod's annotation cannot be turned into a claim (a sentence, pod-facing)."""

    why: str


def _parts(raw: Mapping[str, Any]) -> tuple[tuple[CardId, ...], ...] | Untrusted:
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    try:
        decoded = decode_devices(str(annotations.get(ANNOTATION_ALLOCATED, "")))
    except (ContractError, ValueError) as exc:
        # ValueError: a memory or cores field past Python's int-parsing digit limit.
        return Untrusted(why=f"it cannot be read ({exc})")
    return tuple(tuple(entry.card for entry in part) for part in decoded)


def _demand(raw: Mapping[str, Any], resources: ResourceSettings) -> Demand | Untrusted:
    try:
        pod = read_demand(raw, count_resource=resources.count, memory_resource=resources.memory)
    except InvalidQuantity as exc:
        return Untrusted(why=f"the pod's own request cannot be read ({exc})")
    if not pod.asks:
        return Untrusted(why=f"the pod does not ask for {resources.count}")
    return demand_of(pod.requests())


def _server(cards: Sequence[CardId], view: FleetView) -> ServerFacts | Untrusted:
    servers = sorted({split_card_id(card)[0] for card in cards})
    if len(servers) != 1:
        return Untrusted(why=f"it names {len(servers)} servers ({', '.join(servers)}), not 1")
    facts = view.facts.get(servers[0])
    if facts is None:
        return Untrusted(why=f"server {servers[0]} is not in the fleet")
    unknown = [c for c in cards if c not in view.cards]
    if unknown:
        return Untrusted(why=f"server {facts.name} has no card {unknown[0]}")
    return facts


def _server_fit(cards: Sequence[Card], demand: Demand, facts: ServerFacts) -> str | None:
    missing = {c.id for c in facts.healthy} - {c.id for c in cards}
    if missing:
        return (
            f"it names {len(cards)} cards of {facts.name}, not every healthy card "
            f"({len(facts.healthy)}) as server granularity gives"
        )
    for ask in demand.asks:
        enough = sum(1 for c in cards if c.memory_mib >= ask.memory_mib)
        if enough < ask.count:
            return (
                f"a container asks for {ask.count} card(s) of {ask.memory_mib} MiB, and only "
                f"{enough} of the named cards have that much"
            )
    return None


def _card_fit(cards: Sequence[Card], demand: Demand) -> str | None:
    if len(cards) != demand.effective_count:
        return f"it names {len(cards)} cards and the pod needs {demand.effective_count}"
    small = [c for c in cards if c.memory_mib < demand.max_memory_mib]
    if small:
        return (
            f"card {small[0].id} has {small[0].memory_mib} MiB, less than the "
            f"{demand.max_memory_mib} MiB the pod asks for"
        )
    return None


def _fit(
    cards: tuple[Card, ...], demand: Demand, facts: ServerFacts, granularity: Granularity
) -> tuple[ContainerAssignment, ...] | Untrusted:
    if granularity == "server":
        problem = _server_fit(cards, demand, facts)
    else:
        problem = _card_fit(cards, demand)
    if problem is not None:
        return Untrusted(why=problem)
    return assign(demand.containers, cards, granularity)


def _same(given: Sequence[Sequence[CardId]], expected: Sequence[ContainerAssignment]) -> bool:
    return [frozenset(p) for p in given] == [frozenset(a.cards) for a in expected]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Placement:
    """What a trusted annotation says: the server, the pod's cards, each container's share."""

    facts: ServerFacts
    cards: tuple[CardId, ...]
    containers: tuple[ContainerAssignment, ...]


def _placement(
    parts: Sequence[Sequence[CardId]], demand: Demand, view: FleetView, granularity: Granularity
) -> _Placement | Untrusted:
    ids = tuple(dict.fromkeys(card for part in parts for card in part))
    facts = _server(ids, view) if ids else Untrusted(why="it names no card")
    if isinstance(facts, Untrusted):
        return facts
    containers = _fit(tuple(view.cards[c] for c in ids), demand, facts, granularity)
    if isinstance(containers, Untrusted):
        return containers
    if not _same(parts, containers):
        return Untrusted(why="its cards per container differ from what rgpu assigns")
    return _Placement(facts=facts, cards=ids, containers=containers)


def vet(
    raw: Mapping[str, Any],
    pod: PodInfo,
    *,
    view: FleetView,
    resources: ResourceSettings,
    granularity: Granularity,
    now: float,
) -> Claim | Untrusted:
    """The claim ``raw``'s annotation describes, if rgpu could have given it for the pod's
    own demand on the current fleet; otherwise why not. (The scheduler is checked before.)"""
    demand = _demand(raw, resources)
    if isinstance(demand, Untrusted):
        return demand
    parts = _parts(raw)
    if isinstance(parts, Untrusted):
        return parts
    if len(parts) != len(demand.containers):
        counts = f"{len(parts)} container parts and the pod {len(demand.containers)} containers"
        return Untrusted(why=f"it has {counts}")
    placed = _placement(parts, demand, view, granularity)
    if isinstance(placed, Untrusted):
        return placed
    return Claim(
        pod=pod.ref,
        server=placed.facts.name,
        cards=placed.cards,
        containers=placed.containers,
        state=ClaimState.BOUND,
        booked_at=now,
        committed_at=now,
        node=NodeName(pod.node_name or ""),
    )
