""" "should we run `server` or `card` granularity — or one lupine per GPU?" is a capacity
question operators answer before changing a setting. ``rgpu simulate`` replays a described fleet
and workload through the allocator's own decision code (``rgpu_placement.choose``, which the
service runs) in simulated time, once per layout — server granularity, card granularity, and
per-GPU lupine instances (each card a server of its own, booked whole: card-size isolation) —
and compares utilisation, waits and refusals. With ``queues`` (``queues.yaml`` of ConfigMap
``rgpu-queues``, checked by ``rgpu_placement.QueueConfig``) and a workload spread over
namespaces, with gangs, each pass walks the waiting pods as admission does
(``simulate_queues``): quotas, fair share by weight, gangs whole or not at all.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rgpu_contracts import (
    Card,
    CardId,
    Claim,
    ContainerKind,
    ContainerRequest,
    Fleet,
    GpuUuid,
    Server,
    ServerName,
    card_id,
    instance_server_name,
    node_of_server,
)
from rgpu_placement import (
    NO_QUEUES,
    FleetView,
    Granularity,
    NeverFits,
    QueueConfig,
    QueueConfigError,
    demand_of,
    never_fits,
)

from .simulate_queues import Held, SimPod, admission_pass
from .timeline import Hold

__all__ = ["SimResult", "SimSpec", "SpecError", "load_spec", "never_fitting", "simulate"]


class SpecError(ValueError):
    """The simulation spec is malformed; the message names the key and what is expected."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodShape:
    """One kind of pod in the workload mix: cards per container, memory per card, weight."""

    cards: tuple[int, ...]
    memory_mib: int = 0
    weight: float = 1.0
    gang: int = 0
    """Pods of this shape arrive as a gang of this many (0: alone)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimSpec:
    """A described fleet and workload."""

    servers: int
    cards: int
    memory_mib: int
    pods: int
    arrival_rate: float
    """Pods per second, Poisson arrivals."""
    run_seconds: tuple[float, float]
    shapes: tuple[PodShape, ...]
    seed: int = 0
    namespaces: tuple[tuple[str, float], ...] = (("default", 1.0),)
    """Namespaces and their share of the arrivals."""
    queues: QueueConfig = NO_QUEUES


def _number(
    raw: Mapping[str, Any], key: str, default: float | None = None, *, minimum: float = 0
) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise SpecError(f"{key}: expected a number >= {minimum}, got {value!r}")
    return float(value)


def _shape(raw: object, index: int) -> PodShape:
    if not isinstance(raw, Mapping):
        raise SpecError(f"workload.shapes[{index}]: expected a mapping with 'cards'")
    cards = raw.get("cards")
    cards = [cards] if isinstance(cards, int) else cards
    if (
        not isinstance(cards, list)
        or not cards
        or not all(isinstance(c, int) and c >= 0 for c in cards)
    ):
        raise SpecError(
            f"workload.shapes[{index}].cards: expected a count or a list of counts per container"
        )
    gang = raw.get("gang", 0)
    if isinstance(gang, bool) or not isinstance(gang, int) or gang < 0 or gang == 1:
        raise SpecError(
            f"workload.shapes[{index}].gang: expected a whole number of members, 2 or more"
        )
    return PodShape(
        cards=tuple(cards),
        memory_mib=int(_number(raw, "memory_mib", 0)),
        weight=_number(raw, "weight", 1.0),
        gang=gang,
    )


def _namespaces(raw: object) -> tuple[tuple[str, float], ...]:
    if raw is None:
        return (("default", 1.0),)
    if not isinstance(raw, Mapping) or not raw:
        raise SpecError("workload.namespaces: expected a mapping of namespace -> share")
    found = []
    for name, share in raw.items():
        if not isinstance(name, str) or not name:
            raise SpecError(f"workload.namespaces: {name!r} is not a namespace name")
        if isinstance(share, bool) or not isinstance(share, int | float) or share <= 0:
            raise SpecError(f"workload.namespaces.{name}: expected a share > 0, got {share!r}")
        found.append((name, float(share)))
    return tuple(found)


def _queues(raw: object) -> QueueConfig:
    try:
        return QueueConfig.from_mapping(raw)
    except QueueConfigError as exc:
        where = f"queues.{exc.path}" if exc.path else "queues"
        raise SpecError(f"{where}: {exc.reason}") from exc


def load_spec(raw: object) -> SimSpec:
    """Validate a parsed YAML spec (``fleet:`` and ``workload:`` sections)."""
    if not isinstance(raw, Mapping):
        raise SpecError("spec: expected a mapping with 'fleet' and 'workload'")
    fleet, workload = raw.get("fleet") or {}, raw.get("workload") or {}
    if not isinstance(fleet, Mapping) or not isinstance(workload, Mapping):
        raise SpecError("fleet and workload: expected mappings")
    run = workload.get("run_seconds", [30, 120])
    if not (
        isinstance(run, list) and len(run) == 2 and all(isinstance(x, int | float) for x in run)
    ):
        raise SpecError("workload.run_seconds: expected [min, max] seconds")
    shapes = workload.get("shapes") or [{"cards": 1}]
    if not isinstance(shapes, list):
        raise SpecError("workload.shapes: expected a list")
    return SimSpec(
        servers=int(_number(fleet, "servers", minimum=1)),
        cards=int(_number(fleet, "cards", minimum=1)),
        memory_mib=int(_number(fleet, "memory_mib", 81920, minimum=1)),
        pods=int(_number(workload, "pods", minimum=1)),
        arrival_rate=_number(workload, "arrival_rate", minimum=0.0001),
        run_seconds=(float(min(run)), float(max(run))),
        shapes=tuple(_shape(s, i) for i, s in enumerate(shapes)),
        seed=int(_number(raw, "seed", 0)),
        namespaces=_namespaces(workload.get("namespaces")),
        queues=_queues(raw.get("queues")),
    )


def _card(server: ServerName, node: int, index: int, memory_mib: int) -> Card:
    uuid = GpuUuid(f"GPU-{node:03d}-{index}")
    return Card(
        id=card_id(server, uuid),
        server=server,
        uuid=uuid,
        index=index,
        memory_mib=memory_mib,
        cores=100,
        model="sim",
        numa=0,
        healthy=True,
    )


def _server(name: ServerName, node: int, port: int, cards: tuple[Card, ...]) -> Server:
    return Server(
        name=name,
        endpoint=f"10.0.{node // 250}.{node % 250 + 1}:{port}",
        port=port,
        ready=True,
        reachable=True,
        usage_reported=True,
        busy=frozenset(),
        topology=(),
        cards=cards,
    )


def _fleet(spec: SimSpec, *, per_gpu: bool = False) -> Fleet:
    """``spec``'s servers; with ``per_gpu`` each card is a lupine instance of its own."""
    servers = []
    for i in range(spec.servers):
        node = f"gpu-{i + 1:03d}"
        if per_gpu:
            for j in range(spec.cards):
                name = instance_server_name(node, 14834 + j)
                card = _card(name, i, j, spec.memory_mib)
                servers.append(_server(name, i, 14834 + j, (card,)))
            continue
        name = ServerName(node)
        cards = tuple(_card(name, i, j, spec.memory_mib) for j in range(spec.cards))
        servers.append(_server(name, i, 14833, cards))
    return Fleet(revision=1, observed_at=0.0, servers=tuple(servers))


@dataclass(slots=True, kw_only=True)
class SimResult:
    """What one layout achieved on the spec."""

    granularity: str
    per_gpu: bool = False
    waits: list[float] = field(default_factory=list)
    held_card_seconds: float = 0.0
    used_card_seconds: float = 0.0
    makespan: float = 0.0
    refusals: Counter[str] = field(default_factory=Counter)
    never_placed: int = 0
    total_cards: int = 0
    holds: list[Hold] = field(default_factory=list)
    """Every pod's time on its server, for the timeline."""
    namespace_waits: dict[str, list[float]] = field(default_factory=dict)
    most_held: dict[str, int] = field(default_factory=dict)
    """The most cards each namespace held at once."""

    def refusal_counts(self) -> list[tuple[str, int]]:
        """Refusals by reason, most first, ties by name (the same order every run)."""
        return sorted(self.refusals.items(), key=lambda item: (-item[1], item[0]))

    @property
    def label(self) -> str:
        """How the layout is named in a table."""
        return "per-GPU instances" if self.per_gpu else f"granularity {self.granularity}"

    def held_share(self) -> float:
        return self.held_card_seconds / (self.total_cards * self.makespan) if self.makespan else 0.0

    def used_share(self) -> float:
        return self.used_card_seconds / (self.total_cards * self.makespan) if self.makespan else 0.0

    def wait(self, q: int, namespace: str | None = None) -> float:
        waits = self.waits if namespace is None else self.namespace_waits.get(namespace, [])
        if len(waits) < 2:
            return waits[0] if waits else 0.0
        return statistics.quantiles(waits, n=100, method="inclusive")[q - 1]


def _requests(shape: PodShape) -> tuple[ContainerRequest, ...]:
    return tuple(
        ContainerRequest(name=f"c{j}", kind=ContainerKind.APP, count=n, memory_mib=shape.memory_mib)
        for j, n in enumerate(shape.cards)
    )


def _pods(spec: SimSpec) -> list[SimPod]:
    rng = random.Random(f"rgpu-simulate:{spec.seed}")
    # Namespaces are drawn from a stream of their own: one namespace draws nothing, so a spec
    # without namespaces replays exactly as before they existed.
    spread = random.Random(f"rgpu-simulate-namespaces:{spec.seed}")
    names, shares = [n for n, _ in spec.namespaces], [w for _, w in spec.namespaces]
    clock, pods = 0.0, list[SimPod]()
    while len(pods) < spec.pods:
        clock += rng.expovariate(spec.arrival_rate)
        shape = rng.choices(spec.shapes, weights=[s.weight for s in spec.shapes])[0]
        requests = _requests(shape)
        namespace = names[0] if len(names) == 1 else spread.choices(names, weights=shares)[0]
        gang = f"gang-{len(pods):05d}" if shape.gang else None
        for _ in range(shape.gang or 1):
            pods.append(
                SimPod(
                    uid=f"pod-{len(pods):05d}",
                    arrival=clock,
                    run=rng.uniform(*spec.run_seconds),
                    requests=requests,
                    namespace=namespace,
                    gang=gang,
                    gang_size=shape.gang,
                )
            )
    return pods


def _hold(pod: SimPod, claim: Claim, index: Mapping[CardId, int], now: float) -> Hold:
    """The pod's time on the node: a per-GPU instance's card drawn in its node's lane."""
    return Hold(
        server=node_of_server(claim.server),
        pod=pod.uid,
        start=now,
        end=now + pod.run,
        first=min(index[card] for card in claim.cards),
        cards=len(claim.cards),
    )


def never_fitting(
    spec: SimSpec, granularity: Granularity, *, per_gpu: bool = False
) -> list[tuple[PodShape, NeverFits]]:
    """The shapes of the workload no server of the layout's fleet could ever take."""
    fleet = _fleet(spec, per_gpu=per_gpu)
    found = []
    for shape in spec.shapes:
        never = never_fits(fleet, demand_of(_requests(shape)), granularity)
        if never is not None:
            found.append((shape, never))
    return found


def simulate(spec: SimSpec, granularity: Granularity, *, per_gpu: bool = False) -> SimResult:
    """Replay the workload in simulated time; ``per_gpu`` runs one lupine per card (each a
    server of one card, in ``granularity``: ``server`` is how such a fleet is run).

    At every arrival and completion the waiting pods are walked as admission walks them
    (``simulate_queues``); a pod or gang that cannot be placed does not block the ones
    behind it. ``refusals`` counts pods refused at least once, by reason.
    """
    fleet = _fleet(spec, per_gpu=per_gpu)
    view = FleetView.build(fleet, None, ())
    index = {card.id: card.index for server in fleet.servers for card in server.cards}
    held, result = (
        Held(),
        SimResult(granularity=granularity, per_gpu=per_gpu, total_cards=spec.servers * spec.cards),
    )
    events: list[tuple[float, int, str, SimPod | None]] = []
    for n, planned in enumerate(_pods(spec)):
        heapq.heappush(events, (planned.arrival, n, "arrive", planned))
    waiting: list[SimPod] = []
    refused: dict[str, set[str]] = {}
    seq = len(events)
    while events:
        now, _, kind, pod = heapq.heappop(events)
        result.makespan = now
        if kind == "arrive" and pod is not None:
            waiting.append(pod)
        else:
            server, uid = kind.split("|", 1)
            held.remove(server, uid)
        walk = admission_pass(
            waiting, view, held, granularity=granularity, config=spec.queues, now=now
        )
        for uid, reasons in walk.refusals.items():
            result.refusals.update(reasons - refused.setdefault(uid, set()))
            refused[uid] |= reasons
        placed: dict[str, Claim] = {claim.pod.uid: claim for claim in walk.placed}
        for candidate in [p for p in waiting if p.uid in placed]:
            waiting.remove(candidate)
            claim = placed[candidate.uid]
            result.waits.append(now - candidate.arrival)
            result.namespace_waits.setdefault(candidate.namespace, []).append(
                now - candidate.arrival
            )
            result.holds.append(_hold(candidate, claim, index, now))
            result.held_card_seconds += len(claim.cards) * candidate.run
            result.used_card_seconds += candidate.cards * candidate.run
            seq += 1
            heapq.heappush(
                events, (now + candidate.run, seq, f"{claim.server}|{candidate.uid}", None)
            )
        for namespace, cards in held.by_namespace().items():
            result.most_held[namespace] = max(result.most_held.get(namespace, 0), cards)
    result.never_placed = len(waiting)
    return result
