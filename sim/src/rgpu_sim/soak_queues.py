"""The queue workload: teams sharing the pool. Three namespaces send pods — ``default`` with no
quota, ``team-a`` with a quota of about three eighths of the fleet's cards, ``team-b`` with
half of them and three times the weight — and some pods come in gangs. rgpu promises that no
namespace holds more than its quota, that a gang runs whole or not at all, and that within one
priority the namespace holding least per unit of weight goes first. The soak judges the three
from the apiserver's record and the kubelet's, never from rgpu's books.

Definitions (docs/operations.md repeats them):
* a namespace's *holding* at a resourceVersion is the sum of the cards of its pods' claims in
  every claim Lease as stored just before it (a whole-server claim lists all the server's
  healthy cards, so it counts them all), as rgpu counts "held or admitted";
* a gang *ran in part* when one member ran (kubelet) at a moment a sibling had neither started
  nor held a claim, or when a sibling never ran at all; siblings evicted by preemption, or
  whose scheduling hit an injected fault after admission, are excused and counted (rgpu
  admits a gang whole; after that, a failed Binding or an eviction is the pod's own);
* a pod Q of namespace A *waited unfairly* for a pod P of namespace B ≠ A when P's claim was
  written (its admission) while Q, of P's priority and no gang, had been waiting behind rgpu's
  gate for ``FAIR_SLACK_SECONDS`` and stayed unbooked for ``FAIR_SLACK_SECONDS`` after, was
  promised no server by a preemption, could have used what P got (the cards of P's claim
  would take Q), A had room in its quota for Q, and A would still have held no more per unit
  of weight than B without P after taking Q: ``(held(A) + cards(Q)) / weight(A) <=
  held(B) / weight(B)``, with held(A) the most and held(B) the least either held in the
  ``FAIR_SLACK_SECONDS`` before P's claim (the allocator decides on caches that may lag). P's
  nominated for the server they got (a preemption) and every member but a gang's first are
  left out; so are gang members as Q (a gang needs all its cards at once).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rgpu_kubesim.kubelet import RunRecord

from .checks import CheckResult
from .soak_admission import ClaimHistory
from .soak_evidence import LeaseVersion, PodLife
from .soak_sizing import Servers, units_of
from .soak_workload import GANG_LABEL, SoakPod
from .verdict import WakeUp

__all__ = [
    "FAIR_SLACK_SECONDS",
    "GANG_SHARE",
    "QUEUE_NAMESPACES",
    "Holdings",
    "QueueSetup",
    "check_gangs_whole",
    "check_quotas",
    "plan_queues",
    "queue_problems",
    "queue_waits",
    "unit_needs",
]

QUEUE_NAMESPACES = ("default", "team-a", "team-b")
GANG_SHARE = 0.1
"""Share of the queue workload's pods that are gang members (gangs of two or three)."""
FAIR_SLACK_SECONDS = 5.0
"""How long a pod must have waited before, and stay waiting after, another namespace's
admission for fair share to judge it: the allocator sees a new pod a watch hop late (seconds
when the faults cut its watch and 429 its relist), an admission pass decides before its
writes land, and a write refused with 429 lands a second later."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueSetup:
    """Each namespace's quota (cards; ``None``: no limit) and weight, as the soak configures
    ConfigMap ``rgpu-queues``."""

    quotas: Mapping[str, int | None]
    weights: Mapping[str, int]

    def weight(self, namespace: str) -> int:
        return self.weights.get(namespace, 1)

    def quota(self, namespace: str) -> int | None:
        return self.quotas.get(namespace)

    def document(self) -> str:
        """``queues.yaml`` for the ConfigMap."""
        lines = ["default: {weight: 1}", "namespaces:"]
        for namespace in sorted(self.weights):
            quota = self.quotas.get(namespace)
            cards = "" if quota is None else f"cards: {quota}, "
            lines.append(f"  {namespace}: {{{cards}weight: {self.weights[namespace]}}}")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        return ", ".join(
            f"{n} {'no quota' if self.quota(n) is None else f'{self.quota(n)} cards'} "
            f"weight {self.weight(n)}"
            for n in QUEUE_NAMESPACES
        )


def _gangs(plans: Iterable[SoakPod]) -> dict[tuple[str, str], list[SoakPod]]:
    found: dict[tuple[str, str], list[SoakPod]] = defaultdict(list)
    for pod in plans:
        if pod.gang:
            found[(pod.namespace, pod.gang)].append(pod)
    return found


def unit_cards(members: Sequence[SoakPod], servers: Servers, granularity: str) -> int:
    """The most cards a unit (a pod, or a gang's members) can count against its quota."""
    if granularity == "server":
        return len(members) * max((len(cards) for cards in servers), default=0)
    return sum(units_of(pod, "card") for pod in members)


def unit_needs(plans: Sequence[SoakPod], servers: Servers, granularity: str) -> dict[str, int]:
    """Pod key → the most cards its unit (the pod, or its whole gang) counts against a quota."""
    needs = {p.key: unit_cards([p], servers, granularity) for p in plans if not p.gang}
    for members in _gangs(plans).values():
        need = unit_cards(members, servers, granularity)
        needs |= dict.fromkeys((m.key for m in members), need)
    return needs


def plan_queues(plans: Sequence[SoakPod], servers: Servers, granularity: str) -> QueueSetup:
    """Quotas of about 3/8 (``team-a``) and 1/2 (``team-b``) of the fleet's healthy cards,
    raised where needed so the largest unit of the namespace can be admitted."""
    total = sum(len(cards) for cards in servers)
    largest: dict[str, int] = defaultdict(int)
    for pod in plans:
        if not pod.gang:
            need = unit_cards([pod], servers, granularity)
            largest[pod.namespace] = max(largest[pod.namespace], need)
    for (namespace, _), members in _gangs(plans).items():
        largest[namespace] = max(largest[namespace], unit_cards(members, servers, granularity))
    quotas = {
        "team-a": max(math.ceil(total * 3 / 8), largest["team-a"]),
        "team-b": max(math.ceil(total / 2), largest["team-b"]),
    }
    return QueueSetup(quotas=quotas, weights={"team-a": 1, "team-b": 3})


def queue_problems(
    plans: Sequence[SoakPod], setup: QueueSetup, servers: Servers, granularity: str
) -> list[str]:
    """Units that could never be admitted: more cards than their quota, or (whole servers) a
    gang larger than the fleet."""
    problems = []
    for (namespace, gang), members in _gangs(plans).items():
        if granularity == "server" and len(members) > sum(1 for c in servers if c):
            problems.append(f"{namespace}/{gang} has {len(members)} members, more than servers")
        need, quota = unit_cards(members, servers, granularity), setup.quota(namespace)
        if quota is not None and need > quota:
            problems.append(f"{namespace}/{gang} needs {need} cards, quota {quota}")
    return problems


# --- holdings --------------------------------------------------------------------------------


@dataclass(slots=True)
class Holdings:
    """Each namespace's holding after every Lease version, in rv order."""

    rvs: list[int] = field(default_factory=list)
    ats: list[float] = field(default_factory=list)
    held: list[dict[str, int]] = field(default_factory=list)

    @classmethod
    def of(cls, leases: Iterable[LeaseVersion], lives: Mapping[str, PodLife]) -> Holdings:
        holdings = cls()
        current: dict[str, dict[str, int]] = {}
        totals: dict[str, int] = defaultdict(int)
        for version in sorted(leases, key=lambda v: v.rv):
            now: dict[str, int] = defaultdict(int)
            for uid, cards in version.holders:
                life = lives.get(uid)
                if life is not None:
                    now[life.key.split("/")[0]] += len(cards)
            for namespace, count in current.get(version.server, {}).items():
                totals[namespace] -= count
            for namespace, count in now.items():
                totals[namespace] += count
            current[version.server] = dict(now)
            holdings.rvs.append(version.rv)
            holdings.ats.append(version.at)
            holdings.held.append({n: c for n, c in totals.items() if c})
        return holdings

    def before(self, rv: int) -> dict[str, int]:
        """Holdings as the Leases stood just before ``rv``."""
        at = _bisect_left(self.rvs, rv) - 1
        return self.held[at] if at >= 0 else {}

    def window(self, rv: int, seconds: float, *, after: float = 0.0) -> list[dict[str, int]]:
        """Every holding the Leases showed from ``seconds`` before ``rv`` was written (the one
        standing when the window opened first) to just before it, and with ``after`` the
        holdings of the ``after`` seconds that followed too."""
        end = _bisect_left(self.rvs, rv)
        at = self.ats[min(end, len(self.ats) - 1)] if self.ats else 0.0
        start = max(end - 1, 0)
        while start > 0 and self.ats[start] > at - seconds:
            start -= 1
        stop = end
        while after and stop < len(self.ats) and self.ats[stop] <= at + after:
            stop += 1
        return self.held[start:stop] if stop > start and end > 0 else [{}, *self.held[:stop]]


def _bisect_left(values: Sequence[int], value: int) -> int:
    low, high = 0, len(values)
    while low < high:
        middle = (low + high) // 2
        if values[middle] < value:
            low = middle + 1
        else:
            high = middle
    return low


def check_quotas(holdings: Holdings, setup: QueueSetup) -> CheckResult:
    """No namespace ever held more cards than its quota, in any Lease version."""
    over: dict[str, tuple[int, int, int]] = {}
    peak: dict[str, int] = defaultdict(int)
    for rv, held in zip(holdings.rvs, holdings.held, strict=True):
        for namespace, cards in held.items():
            peak[namespace] = max(peak[namespace], cards)
            quota = setup.quota(namespace)
            if quota is not None and cards > quota and namespace not in over:
                over[namespace] = (rv, cards, quota)
    figures = ", ".join(
        f"{n} {peak[n]}/{setup.quota(n)}" for n in sorted(setup.quotas) if setup.quota(n)
    )
    return CheckResult(
        name=f"no namespace ever over its quota (most held / quota: {figures})",
        passed=not over,
        detail="; ".join(
            f"{n} held {c} cards at rv {rv}, quota {q}" for n, (rv, c, q) in sorted(over.items())
        ),
    )


# --- gangs -----------------------------------------------------------------------------------


def _covered(spans: Sequence[tuple[float, float]], start: float, end: float) -> bool:
    """Whether ``spans`` (time intervals) cover ``[start, end)`` without a gap."""
    reach = start
    for begin, finish in sorted(spans):
        if begin > reach:
            return False
        reach = max(reach, finish)
        if reach >= end:
            return True
    return reach >= end


def check_gangs_whole(
    lives: Iterable[PodLife],
    runs: Mapping[str, RunRecord],
    claims: ClaimHistory,
    excused: set[str],
    now: float,
) -> CheckResult:
    """No gang ran in part: while any member ran, every sibling had started or held a claim,
    and no sibling of a member that ran never ran (``runs``: uid → the kubelet's record;
    ``excused``: keys of pods evicted by preemption or whose scheduling hit an injected
    fault after admission — rgpu admits a gang whole, it does not hold it together after)."""
    gangs: dict[tuple[str, str], list[PodLife]] = defaultdict(list)
    for life in lives:
        gang = life.labels.get(GANG_LABEL)
        if gang:
            gangs[(life.key.split("/")[0], gang)].append(life)
    problems, forgiven = [], 0
    for (namespace, gang), members in sorted(gangs.items()):
        for member in members:
            run = runs.get(member.uid)
            if run is None:
                continue
            end = run.finished_at if run.finished_at is not None else now
            for sibling in members:
                if sibling is member:
                    continue
                started = runs[sibling.uid].started_at if sibling.uid in runs else math.inf
                spans = [
                    (s.start_at, s.end_at if s.end_at is not None else math.inf)
                    for s in claims.spans.get(sibling.uid, ())
                ]
                never = started == math.inf and sibling.end_at is not None
                if not never and (
                    min(end, started) <= run.started_at
                    or _covered(spans, run.started_at, min(end, started))
                ):
                    continue
                if sibling.key in excused:
                    forgiven += 1
                    continue
                what = "never ran" if never else "had neither started nor a claim"
                problems.append(f"{namespace}/{gang}: {member.key} ran while {sibling.key} {what}")
    return CheckResult(
        name=f"no gang ever partly running ({len(gangs)} gangs, {forgiven} excused: a member "
        "evicted, or whose scheduling hit an injected fault)",
        passed=not problems,
        detail="; ".join(problems[:5]),
    )


# --- wake-ups --------------------------------------------------------------------------------


def queue_waits(
    waits: Sequence[WakeUp],
    lives: Iterable[PodLife],
    holdings: Holdings,
    claims: ClaimHistory,
    setup: QueueSetup,
) -> list[WakeUp]:
    """Wake-ups measured from the moment the pod could be admitted: its unit free, its
    namespace with room in its quota for it, and (a gang) every member's unit free."""
    by_key = {life.key: life for life in lives}
    freed: dict[str, float] = {}
    for wake in waits:
        life = by_key[wake.key]
        assert life.bound_at is not None
        freed[wake.key] = life.bound_at - wake.seconds
    gang_freed: dict[tuple[str, str], float] = defaultdict(float)
    for key, moment in freed.items():
        gang = by_key[key].labels.get(GANG_LABEL)
        if gang:
            slot = (key.split("/")[0], gang)
            gang_freed[slot] = max(gang_freed[slot], moment)
    found = []
    for wake in waits:
        life = by_key[wake.key]
        assert life.bound_at is not None
        moments = [freed[wake.key], _room(life, holdings, claims, setup)]
        gang = life.labels.get(GANG_LABEL)
        if gang:
            moments.append(gang_freed[(wake.key.split("/")[0], gang)])
        found.append(
            WakeUp(
                key=wake.key,
                server=wake.server,
                seconds=life.bound_at - max(moments),
                promised_to=wake.promised_to,
            )
        )
    return found


def _room(life: PodLife, holdings: Holdings, claims: ClaimHistory, setup: QueueSetup) -> float:
    """The last moment before ``life``'s claim at which its namespace got room for it."""
    namespace = life.key.split("/")[0]
    quota, first = setup.quota(namespace), claims.first(life.uid)
    if quota is None or first is None:
        return 0.0
    cards = first.cards
    end = _bisect_left(holdings.rvs, first.start_rv)
    for index in range(end - 1, 0, -1):
        if holdings.rvs[index] < life.created_rv:
            break
        had = holdings.held[index - 1].get(namespace, 0) + cards <= quota
        has = holdings.held[index].get(namespace, 0) + cards <= quota
        if has and not had:
            return holdings.ats[index]
    return 0.0
