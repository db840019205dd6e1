"""The gate path's and the queue workload's PASS/FAIL lines, put together from the soak's
evidence: which pods the wake-up check judges on each path, the admission checks
(``soak_admission``), the queue checks (``soak_queues``) and the quota room the urgent-pod
check must leave out. Kept apart from ``soak`` so the run and the judgement each stay
readable."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rgpu_kubesim import PodRecord
from rgpu_kubesim.kubelet import RunRecord

from .checks import CheckResult
from .soak_admission import (
    ClaimHistory,
    Cycles,
    check_admitted_before_filter,
    check_cycles,
    check_no_gated_nudge,
    count_cycles,
    gated_parked,
)
from .soak_evidence import Evidence, PodLife
from .soak_fairness import FairInputs, check_fair_share
from .soak_faults import FaultWindow
from .soak_plan import SoakPlan
from .soak_priority import Room
from .soak_queues import (
    Holdings,
    check_gangs_whole,
    check_quotas,
    queue_waits,
    unit_needs,
)
from .verdict import WakeUp, wake_seconds

__all__ = ["Judged", "judge"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Judged:
    """What the soak's own checks add, and the figures the summary prints."""

    checks: tuple[CheckResult, ...]
    waits: tuple[WakeUp, ...]
    cycles: Cycles
    room: Room | None
    queues: str = ""


def _erred(records: Mapping[str, PodRecord]) -> frozenset[str]:
    # A pod whose scheduling hit an error (an extender replica killed under it, a Binding
    # failed by the faults) waited for the fault, not for rgpu.
    return frozenset(uid for uid, rec in records.items() if rec.errors)


def _keys(lives: Mapping[str, PodLife], records: Mapping[str, PodRecord]) -> set[str]:
    """Keys of the pods whose scheduling hit an error."""
    return {lives[uid].key for uid in _erred(records) if uid in lives}


def _parked(
    lives: Iterable[PodLife], records: Mapping[str, PodRecord], gate: bool
) -> dict[str, float]:
    """Whose wake-up is judged: on the gate path every gated pod (its wait is behind the
    gate); on the filter path every pod the scheduler refused at least once."""
    erred = _erred(records)
    if gate:
        return gated_parked(lives, erred)
    return {uid: rec.first_seen for uid, rec in records.items() if rec.refusals and not rec.errors}


def _room(holdings: Holdings, plan: SoakPlan) -> Room | None:
    setup = plan.queues
    if setup is None:
        return None
    needs = unit_needs(plan.pods, plan.servers, plan.sizing.unit)

    def room(pod: PodLife, rv: int) -> bool:
        namespace = pod.key.split("/")[0]
        quota = setup.quota(namespace)
        if quota is None:
            return True
        # The most the pod's unit (itself, or its whole gang) could count: an rv with less
        # room is not one where rgpu could have admitted it.
        return holdings.before(rv).get(namespace, 0) + needs.get(pod.key, 0) <= quota

    return room


def judge(
    evidence: Evidence,
    *,
    records: Mapping[str, PodRecord],
    runs: Mapping[str, RunRecord],
    windows: Sequence[FaultWindow],
    plan: SoakPlan,
    gate: bool,
    evicted: set[str],
    now: float,
) -> Judged:
    """The gate path's and the queues' checks (none of either when off), and the wake-ups;
    ``evicted``: keys of the pods preemption evicted."""
    lives = evidence.pods
    per_card = plan.sizing.unit == "card"
    claims = ClaimHistory.of(evidence.leases)
    holdings = Holdings.of(evidence.leases, lives)
    waits = wake_seconds(
        evidence.leases,
        lives.values(),
        _parked(lives.values(), records, gate),
        windows,
        per_card=per_card,
    )
    cycles = count_cycles(lives.values(), records, claims, gate=gate)
    checks: list[CheckResult] = []
    if gate:
        filtered = {u: r.filtered_rv for u, r in records.items() if r.filtered_rv is not None}
        checks += [
            check_admitted_before_filter(lives.values(), filtered, claims),
            check_cycles(cycles),
            check_no_gated_nudge(lives.values()),
        ]
    summary = ""
    if plan.queues is not None:
        waits = queue_waits(waits, lives.values(), holdings, claims, plan.queues)
        inputs = FairInputs(
            setup=plan.queues,
            plans={p.key: p for p in plan.pods},
            memory=plan.memory,
            granularity=plan.sizing.unit,
        )
        checks += [
            check_quotas(holdings, plan.queues),
            check_gangs_whole(lives.values(), runs, claims, evicted | _keys(lives, records), now),
            check_fair_share(lives, evidence.leases, claims, holdings, inputs),
        ]
        summary = plan.queues.describe()
    return Judged(
        checks=tuple(checks),
        waits=tuple(waits),
        cycles=cycles,
        room=_room(holdings, plan),
        queues=summary,
    )
