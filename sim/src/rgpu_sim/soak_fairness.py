"""Fair share, judged from the soak's own evidence: within one priority the namespace holding
least per unit of weight goes first, so a pod of a namespace under its share must not wait while
another namespace, over it, is admitted. The definition (``soak_queues`` states it whole) is
careful to judge only what the allocator could have seen: a pod it had time to see, that could
have used what the other pod got, with quota room, on holdings as they stood over the seconds
its caches may lag."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .checks import CheckResult
from .soak_admission import ClaimHistory
from .soak_evidence import LeaseVersion, PodLife
from .soak_queues import FAIR_SLACK_SECONDS, Holdings, QueueSetup
from .soak_sizing import units_of
from .soak_workload import GANG_LABEL, SoakPod

__all__ = ["FairInputs", "check_fair_share"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Admission:
    """A pod's (a gang's first member's) claim written: its admission."""

    life: PodLife
    rv: int
    at: float
    wall: float
    server: str
    cards: tuple[str, ...]


def _admissions(
    lives: Mapping[str, PodLife], leases: Sequence[LeaseVersion], nominated: set[tuple[str, str]]
) -> list[_Admission]:
    """Each pod's first claim, but those made on a server nominated for the pod, and each
    gang's first member's only (``leases`` in rv order)."""
    seen: set[str] = set()
    gangs: set[tuple[str, str]] = set()
    found = []
    for version in leases:
        for uid, cards in version.holders:
            life = lives.get(uid)
            if life is None or uid in seen:
                continue
            seen.add(uid)
            gang = life.labels.get(GANG_LABEL)
            slot = (life.key.split("/")[0], gang or "")
            if (version.server, uid) in nominated or (gang and slot in gangs):
                continue
            gangs.add(slot)
            found.append(
                _Admission(
                    life=life,
                    rv=version.rv,
                    at=version.at,
                    wall=version.wall,
                    server=version.server,
                    cards=cards,
                )
            )
    return found


def _fits(pod: SoakPod, admission: _Admission, memory: Mapping[str, int], granularity: str) -> bool:
    """Whether the cards ``admission`` got would take ``pod``."""
    cards = [memory.get(card, 0) for card in admission.cards]
    asks = [(n, m or 0) for _, n, m in pod.containers if n]
    if pod.init_cards:
        asks.append((pod.init_cards, 0))
    if granularity == "server":
        return all(sum(1 for c in cards if c >= m) >= n for n, m in asks)
    need = max((m for _, m in asks), default=0)
    return sum(1 for c in cards if c >= need) >= units_of(pod, "card")


@dataclass(frozen=True, slots=True, kw_only=True)
class FairInputs:
    """What fair share is judged on besides the Lease and pod record."""

    setup: QueueSetup
    plans: Mapping[str, SoakPod]
    """The workload's pods by key: what each asked for."""
    memory: Mapping[str, int]
    """Each healthy card's memory (MiB) by card id."""
    granularity: str


def _waiting(lives: Iterable[PodLife], claims: ClaimHistory) -> list[tuple[float, float, PodLife]]:
    """``(from, until, pod)``: when each gated pod of no gang counts as waiting."""
    found = []
    for life in lives:
        if not life.gated or life.labels.get(GANG_LABEL):
            continue
        first = claims.first(life.uid)
        ends = [
            first.start_at - FAIR_SLACK_SECONDS if first is not None else math.inf,
            life.deleting_at if life.deleting_at is not None else math.inf,
            life.end_at if life.end_at is not None else math.inf,
        ]
        start, end = life.created_at + FAIR_SLACK_SECONDS, min(ends)
        if start < end:
            found.append((start, end, life))
    return sorted(found, key=lambda w: w[0])


def check_fair_share(
    lives: Mapping[str, PodLife],
    leases: Sequence[LeaseVersion],
    claims: ClaimHistory,
    holdings: Holdings,
    inputs: FairInputs,
) -> CheckResult:
    """No pod of a namespace under its share waited while another namespace, over it, was
    admitted at the same priority (the module's docstring defines each word)."""
    ordered = sorted(leases, key=lambda v: v.rv)
    nominated = {(v.server, v.nomination.uid) for v in ordered if v.nomination is not None}
    promised: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for version in ordered:
        if version.nomination is not None:
            promised[version.nomination.uid].append((version.rv, version.nomination.expires_at))
    admissions = _admissions(lives, ordered, nominated)
    waiting = _waiting(lives.values(), claims)
    active: list[tuple[float, int, PodLife]] = []
    problems, judged, at = [], 0, 0
    for admission in sorted(admissions, key=lambda a: a.at):
        while at < len(waiting) and waiting[at][0] <= admission.at:
            _, end, life = waiting[at]
            heapq.heappush(active, (end, at, life))
            at += 1
        while active and active[0][0] <= admission.at:
            heapq.heappop(active)
        judged += 1
        # A pod promised a server elsewhere (a preemption's nominee) books nothing else.
        free = [
            life
            for _, _, life in active
            if not any(
                rv < admission.rv and admission.wall < ends for rv, ends in promised[life.uid]
            )
        ]
        unfair = _unfair(admission, free, holdings, inputs)
        if unfair:
            problems.append(unfair)
    return CheckResult(
        name=f"no pod of a namespace under its share waited while another over it was "
        f"admitted at its priority ({judged} admissions judged)",
        passed=not problems,
        detail="; ".join(problems[:5]),
    )


def _unfair(
    admission: _Admission, waiting: Sequence[PodLife], holdings: Holdings, inputs: FairInputs
) -> str | None:
    setup, p = inputs.setup, admission.life
    theirs = p.key.split("/")[0]
    # The allocator decides on its caches, which may lag the apiserver by the slack, and counts
    # the bookings it has in flight, which land up to the slack later: judged on the holdings
    # least favourable to the verdict over those windows.
    seen = holdings.window(admission.rv, FAIR_SLACK_SECONDS)
    around = holdings.window(admission.rv, FAIR_SLACK_SECONDS, after=FAIR_SLACK_SECONDS)
    held = {theirs: min(h.get(theirs, 0) for h in seen)}
    share = held[theirs] / setup.weight(theirs)
    for q in waiting:
        ours = q.key.split("/")[0]
        plan = inputs.plans.get(q.key)
        if ours == theirs or q.priority != p.priority or plan is None:
            continue
        cards = len(admission.cards) if inputs.granularity == "server" else units_of(plan, "card")
        mine = held.setdefault(ours, max(h.get(ours, 0) for h in around))
        quota = setup.quota(ours)
        if quota is not None and mine + cards > quota:
            continue
        if (mine + cards) / setup.weight(ours) > share:
            continue
        if not _fits(plan, admission, inputs.memory, inputs.granularity):
            continue
        return (
            f"{q.key} ({ours} held {mine}, weight {setup.weight(ours)}) waited while {p.key} "
            f"({theirs} held {held.get(theirs, 0)}, weight {setup.weight(theirs)}) was admitted "
            f"on {admission.server} at rv {admission.rv}"
        )
    return None
