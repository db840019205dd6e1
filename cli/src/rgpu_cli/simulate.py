""" "should we run `server` or `card` granularity — or one lupine per GPU?" is a capacity
question operators answer before changing a setting. ``rgpu simulate`` replays a described fleet
and workload through the allocator's own decision code (``rgpu_placement.choose``, which the
service runs) in simulated time, once per layout — server granularity, card granularity, and
per-GPU lupine instances (each card a server of its own, booked whole: card-size isolation) —
and compares utilisation, waits and refusals.
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
    ClaimState,
    ContainerKind,
    ContainerRequest,
    Fleet,
    GpuUuid,
    PodRef,
    PodUID,
    Server,
    ServerName,
    card_id,
    instance_server_name,
    node_of_server,
)
from rgpu_placement import (
    Choice,
    FleetView,
    Granularity,
    NeverFits,
    ServerFacts,
    Unclaimed,
    choose,
    demand_of,
    never_fits,
)

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
    return PodShape(
        cards=tuple(cards),
        memory_mib=int(_number(raw, "memory_mib", 0)),
        weight=_number(raw, "weight", 1.0),
    )


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


class _Held:
    """The simulator's claims, as placement's ``Holdings``."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Claim]] = {}

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return tuple(self.claims.get(server, {}).values())

    def problem(self, server: str) -> str | None:
        return None

    def taken(self, server: str) -> frozenset[CardId]:
        return frozenset(c for claim in self.blocking(server) for c in claim.cards)

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        # Simulated servers report no lupine clients beyond the claims.
        return frozenset()

    def without_claims(self) -> Unclaimed:
        return Unclaimed()


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

    def wait(self, q: int) -> float:
        if len(self.waits) < 2:
            return self.waits[0] if self.waits else 0.0
        return statistics.quantiles(self.waits, n=100, method="inclusive")[q - 1]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pod:
    uid: str
    arrival: float
    run: float
    requests: tuple[ContainerRequest, ...]

    @property
    def cards(self) -> int:
        return sum(r.count for r in self.requests)


def _requests(shape: PodShape) -> tuple[ContainerRequest, ...]:
    return tuple(
        ContainerRequest(name=f"c{j}", kind=ContainerKind.APP, count=n, memory_mib=shape.memory_mib)
        for j, n in enumerate(shape.cards)
    )


def _pods(spec: SimSpec) -> list[_Pod]:
    rng = random.Random(f"rgpu-simulate:{spec.seed}")
    clock, pods = 0.0, []
    for i in range(spec.pods):
        clock += rng.expovariate(spec.arrival_rate)
        shape = rng.choices(spec.shapes, weights=[s.weight for s in spec.shapes])[0]
        requests = _requests(shape)
        pods.append(
            _Pod(
                uid=f"pod-{i:05d}",
                arrival=clock,
                run=rng.uniform(*spec.run_seconds),
                requests=requests,
            )
        )
    return pods


def _claim(pod: _Pod, choice: Choice, now: float) -> Claim:
    return Claim(
        pod=PodRef(uid=PodUID(pod.uid), namespace="sim", name=pod.uid),
        server=choice.fit.facts.name,
        cards=tuple(c.id for c in choice.fit.cards),
        containers=(),
        state=ClaimState.BOUND,
        booked_at=now,
    )


def _hold(pod: _Pod, choice: Choice, now: float) -> Hold:
    """The pod's time on the node: a per-GPU instance's card drawn in its node's lane."""
    cards = choice.fit.cards
    return Hold(
        server=node_of_server(choice.fit.facts.name),
        pod=pod.uid,
        start=now,
        end=now + pod.run,
        first=min(card.index for card in cards),
        cards=len(cards),
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

    Pods are tried in arrival order at every arrival and completion; a later pod may pass a
    blocked one (kube-scheduler retries each pod on its own). ``refusals`` counts pods refused
    at least once, by reason.
    """
    view = FleetView.build(_fleet(spec, per_gpu=per_gpu), None, ())
    held, result = (
        _Held(),
        SimResult(granularity=granularity, per_gpu=per_gpu, total_cards=spec.servers * spec.cards),
    )
    events: list[tuple[float, int, str, _Pod | None]] = []
    for n, planned in enumerate(_pods(spec)):
        heapq.heappush(events, (planned.arrival, n, "arrive", planned))
    waiting: list[_Pod] = []
    refused: dict[str, set[str]] = {}
    seq = len(events)
    while events:
        now, _, kind, pod = heapq.heappop(events)
        result.makespan = now
        if kind == "arrive" and pod is not None:
            waiting.append(pod)
        else:
            server, uid = kind.split("|", 1)
            held.claims[server].pop(uid, None)
        # Placing a pod only takes capacity away, so a shape refused once in this pass stays
        # refused for the rest of it: remember its reasons instead of deciding again.
        refused_shapes: dict[tuple[ContainerRequest, ...], set[str]] = {}
        for candidate in list(waiting):
            reasons = refused_shapes.get(candidate.requests)
            decision = None
            if reasons is None:
                decision = choose(
                    view, demand_of(candidate.requests), held, granularity=granularity
                )
            if not isinstance(decision, Choice):
                if reasons is None and decision is not None:
                    reasons = {r.reason.value for r in decision.nofit.reasons if r.count}
                    refused_shapes[candidate.requests] = reasons
                reasons = reasons or set()
                result.refusals.update(reasons - refused.setdefault(candidate.uid, set()))
                refused[candidate.uid] |= reasons
                continue
            waiting.remove(candidate)
            claim = _claim(candidate, decision, now)
            held.claims.setdefault(claim.server, {})[candidate.uid] = claim
            result.waits.append(now - candidate.arrival)
            result.holds.append(_hold(candidate, decision, now))
            result.held_card_seconds += len(claim.cards) * candidate.run
            result.used_card_seconds += candidate.cards * candidate.run
            seq += 1
            heapq.heappush(
                events, (now + candidate.run, seq, f"{claim.server}|{candidate.uid}", None)
            )
    result.never_placed = len(waiting)
    return result
