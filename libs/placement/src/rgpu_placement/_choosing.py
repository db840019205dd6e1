"""The choice of a server must be deterministic (same state, same
answer, on every replica) and fast, and when nothing fits it must say why in HAMi's words.

Order (docs/design.md#choosing-a-server): locality tier first (finest topology domain shared with a
candidate node), then best fit (fewest cards that still satisfy the request), then server name.
Server granularity's best-fit key (healthy cards, name) does not depend on claims, so servers are
tried in a precomputed order and the first fit wins; card granularity's key is (free cards that
satisfy, healthy cards, name), found by scanning the tier in that same order and stopping at the
first server with exactly the cards needed, which nothing can beat.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from rgpu_contracts import NodeName, NoFit, Reason, ReasonCount, ServerName, ServerVerdict

from ._demand import Demand
from ._fitting import BusyIgnored, Fit, Granularity, Holdings, Unclaimed, fit, verdict
from ._fleetview import FleetView, Path, Ranking, ServerFacts
from ._locality import tiers

__all__ = ["Choice", "Refusal", "choose"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """The server chosen, the cards the pod gets, and the locality tier it was found in."""

    fit: Fit
    tier: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Nothing fits: the reasons, plus the servers only claims (or only lupine's busy reports)
    stand in the way of, best first."""

    nofit: NoFit
    blocked_by_claims: tuple[ServerName, ...]
    blocked_by_busy: tuple[ServerName, ...] = ()
    """Servers that would fit if lupine reported no client on them (claims still count)."""


def _best(
    servers: Iterable[ServerFacts], demand: Demand, held: Holdings, granularity: Granularity
) -> Fit | None:
    if granularity == "server":
        return next((f for s in servers if (f := fit(s, demand, held, "server"))), None)
    best: Fit | None = None
    for server in servers:
        found = fit(server, demand, held, "card")
        if found is not None and (best is None or _tighter(found, best)):
            best = found
            if best.weight == demand.effective_count:
                break  # nothing can fit tighter than exactly the cards needed
    return best


def _tighter(a: Fit, b: Fit) -> bool:
    return _card_key(a) < _card_key(b)


def _card_key(f: Fit) -> tuple[int, int, str]:
    return f.weight, len(f.facts.healthy), f.facts.name


_RANKINGS_KEPT = 256
"""Candidate path sets whose ranking a view keeps; past it the memo starts over (bounded)."""


def _ranking(view: FleetView, candidates: tuple[NodeName, ...]) -> Ranking:
    """The servers by tier for ``candidates``, worked out once per distinct set of paths.

    ``tiers`` depends only on the candidates' distinct paths, so one node per path stands for
    all of them; each group keeps ``view.order`` (the best-fit order), so nothing is sorted
    per decision.
    """
    nowhere = (None,) * len(view.topology_keys)
    standing: dict[Path, NodeName] = {}
    for node in candidates:
        standing.setdefault(view.node_paths.get(node, nowhere), node)
    key = frozenset(standing)
    found = view.rankings.get(key)
    if found is None:
        ranked = tiers(view, tuple(standing.values()))
        depth = len(view.topology_keys)
        groups: list[list[ServerFacts]] = [[] for _ in range(depth + 1)]
        for facts in view.order:
            groups[ranked.get(facts.name, depth)].append(facts)
        found = tuple(tuple(group) for group in groups)
        if len(view.rankings) >= _RANKINGS_KEPT:
            view.rankings.clear()
        view.rankings[key] = found
    return found


def _search(
    view: FleetView,
    demand: Demand,
    held: Holdings,
    candidates: tuple[NodeName, ...],
    granularity: Granularity,
) -> Choice | None:
    for tier, group in enumerate(_ranking(view, candidates)):
        found = _best(group, demand, held, granularity)
        if found is not None:
            return Choice(fit=found, tier=tier)
    return None


def _nofit(verdicts: Sequence[ServerVerdict], total: int) -> NoFit:
    counts: Counter[Reason] = Counter()
    for v in verdicts:
        for rc in v.reasons:
            counts[rc.reason] += rc.count
    reasons = tuple(
        ReasonCount(reason=r, count=n) for r, n in sorted(counts.items(), key=lambda i: i[0].value)
    )
    return NoFit(reasons=reasons, total=total, servers=tuple(verdicts))


def _best_first(
    servers: list[ServerFacts], view: FleetView, candidates: tuple[NodeName, ...]
) -> tuple[ServerName, ...]:
    """``servers`` by tier, then best fit, then name: the order the ranking already has."""
    if not servers:
        return ()
    wanted = {f.name for f in servers}
    return tuple(f.name for group in _ranking(view, candidates) for f in group if f.name in wanted)


_IDLE: Holdings = BusyIgnored(Unclaimed())


def _capable(view: FleetView, demand: Demand, granularity: Granularity) -> tuple[ServerFacts, ...]:
    """The servers that could take ``demand`` were nothing held or busy, in ``view.order``;
    worked out once per view, demand and granularity. A server that fits despite holdings
    is one of them, so the passes below look no further."""
    key = (demand, granularity)
    found = view.capable.get(key)
    if found is None:
        if len(view.capable) >= _RANKINGS_KEPT:
            view.capable.clear()
        found = view.capable[key] = tuple(
            f for f in view.order if fit(f, demand, _IDLE, granularity)
        )
    return found


def _only_claims_block(
    view: FleetView, demand: Demand, held: Holdings, granularity: Granularity
) -> list[ServerFacts]:
    free = held.without_claims()
    return [
        f
        for f in _capable(view, demand, granularity)
        if (held.blocking(f.name) or held.problem(f.name))
        and (_untouched(free, f) or fit(f, demand, free, granularity))
    ]


def _untouched(held: Holdings, f: ServerFacts) -> bool:
    """Nothing in ``held`` bears on ``f``: a capable server then fits, no need to check."""
    name = f.name
    return not (held.busy(f) or held.problem(name) or held.blocking(name) or held.taken(name))


def _only_busy_blocks(
    view: FleetView, demand: Demand, held: Holdings, granularity: Granularity
) -> list[ServerFacts]:
    idle = BusyIgnored(held)
    return [
        f
        for f in _capable(view, demand, granularity)
        if held.busy(f) and fit(f, demand, idle, granularity)
    ]


_VERDICTS_KEPT = 8192
"""Verdicts a view keeps per demand (a few per server); past it they start over (bounded)."""


def _verdicts(
    view: FleetView, demand: Demand, held: Holdings, granularity: Granularity
) -> list[ServerVerdict]:
    """Every server's verdict; in server granularity each is remembered on ``view`` by all
    it depends on (the server, its Lease's problem, its holders, lupine's busy cards)."""
    if granularity != "server":
        return [verdict(f, demand, held, granularity) for f in view.order]
    memo = view.verdicts.get(demand)
    if memo is None:
        if len(view.verdicts) >= _RANKINGS_KEPT:
            view.verdicts.clear()
        memo = view.verdicts[demand] = {}
    found = []
    for f in view.order:
        holders = tuple(c.pod for c in held.blocking(f.name))
        key = (f.name, held.problem(f.name), holders, held.busy(f))
        judged = memo.get(key)
        if judged is None:
            if len(memo) >= _VERDICTS_KEPT:
                memo.clear()
            judged = memo[key] = verdict(f, demand, held, granularity)
        found.append(judged)
    return found


def _refuse(
    view: FleetView,
    demand: Demand,
    held: Holdings,
    candidates: tuple[NodeName, ...],
    granularity: Granularity,
) -> Refusal:
    verdicts = _verdicts(view, demand, held, granularity)
    verdicts.sort(key=lambda v: v.server)
    claimed = _only_claims_block(view, demand, held, granularity)
    busy = _only_busy_blocks(view, demand, held, granularity)
    return Refusal(
        nofit=_nofit(verdicts, view.total_cards),
        blocked_by_claims=_best_first(claimed, view, candidates),
        blocked_by_busy=_best_first(busy, view, candidates),
    )


_WAITING = "nominated for this pod, which waits for this server while its victims leave"


def _held_to(
    view: FleetView,
    demand: Demand,
    held: Holdings,
    candidates: tuple[NodeName, ...],
    granularity: Granularity,
    server: ServerName,
) -> Choice | Refusal:
    """The nominated server, or a refusal that names it: nothing else is chosen."""
    facts = view.facts[server]
    found = fit(facts, demand, held, granularity)
    if found is not None:
        tier = tiers(view, candidates).get(server, len(view.topology_keys))
        return Choice(fit=found, tier=tier)
    said = verdict(facts, demand, held, granularity)
    detail = "; ".join(d for d in (_WAITING, said.detail) if d)
    nofit = _nofit([replace(said, detail=detail)], view.total_cards)
    claimed = bool(held.blocking(server) or held.problem(server)) and fit(
        facts, demand, held.without_claims(), granularity
    )
    busy = bool(held.busy(facts)) and fit(facts, demand, BusyIgnored(held), granularity)
    return Refusal(
        nofit=nofit,
        blocked_by_claims=(server,) if claimed else (),
        blocked_by_busy=(server,) if busy else (),
    )


def choose(
    view: FleetView,
    demand: Demand,
    held: Holdings,
    *,
    candidates: tuple[NodeName, ...] = (),
    granularity: Granularity = "server",
    nominated: ServerName | None = None,
) -> Choice | Refusal:
    """Choose a server for ``demand`` near ``candidates``, or explain why none fits.

    A pod ``nominated`` on a server (freed for it by preemption) gets that server or nothing,
    even when another frees first: its victims were evicted for this pod, and booking
    elsewhere would waste their eviction (docs/design.md §11). A server gone from the fleet holds
    nobody.
    """
    if nominated is not None and nominated in view.facts:
        return _held_to(view, demand, held, candidates, granularity, nominated)
    found = _search(view, demand, held, candidates, granularity)
    if found is not None:
        return found
    return _refuse(view, demand, held, candidates, granularity)
