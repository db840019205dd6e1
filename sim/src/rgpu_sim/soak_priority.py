"""The priority mix's PASS/FAIL lines. Preemption is rgpu's own (docs/design.md §11), so its
promises are judged from what the apiserver stored, never from the allocator's books: pods'
priorities, labels, health and deletions, every Lease version with its claims and its nomination,
and what the workload itself deleted. An eviction is a deletion the workload did not ask for (only
the allocator evicts); its preemptor is the pod the last nomination naming the victim promised the
server to. Each check fails on what it exists to catch (``cli/tests/test_soak_priority.py``)."""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .checks import CheckResult
from .soak_evidence import LeaseVersion, NominationSeen, PodLife
from .soak_faults import FaultWindow
from .soak_workload import BUDGET_LABEL
from .verdict import disturbed, percentile

__all__ = [
    "PREEMPTION_SLACK_SECONDS",
    "Eviction",
    "PreemptionWait",
    "check_budgets",
    "check_no_inversion",
    "check_no_wasted_evictions",
    "check_preemption_latency",
    "evictions",
    "preemption_summary",
    "preemption_waits",
]

PREEMPTION_SLACK_SECONDS = 5.0
"""An urgent pod is bound within its victims' grace period plus this."""
Room = Callable[[PodLife, int], bool]
"""Whether a pod's namespace had room in its quota for it as the Leases stood before an rv."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Eviction:
    """A pod deleted without the workload asking: by whom (the nominee), from which server."""

    victim: PodLife
    server: str | None
    preemptor: str | None
    """The nominee's uid; None when no nomination named the victim."""
    nominated_rv: int


def _by_server(leases: Iterable[LeaseVersion]) -> dict[str, list[LeaseVersion]]:
    found: dict[str, list[LeaseVersion]] = defaultdict(list)
    for version in sorted(leases, key=lambda v: v.rv):
        found[version.server].append(version)
    return found


def evictions(
    leases: Iterable[LeaseVersion], pods: Iterable[PodLife], asked: Mapping[str, float]
) -> list[Eviction]:
    """Every deletion that began before the workload asked for it (``asked``: pod key → when
    the workload first sent its DELETE, monotonic)."""
    naming = [(v, v.nomination) for v in sorted(leases, key=lambda v: v.rv) if v.nomination]
    found = []
    for life in pods:
        if life.deleting_rv is None or life.deleting_at is None:
            continue
        if asked.get(life.key, float("inf")) <= life.deleting_at:
            continue
        named = [(v, n) for v, n in naming if v.rv < life.deleting_rv and life.uid in n.victims]
        version, nomination = named[-1] if named else (None, None)
        found.append(
            Eviction(
                victim=life,
                server=version.server if version else None,
                preemptor=nomination.uid if nomination else None,
                nominated_rv=version.rv if version else 0,
            )
        )
    return found


def _booked(leases: Sequence[LeaseVersion], eviction: Eviction, uid: str) -> bool:
    """Whether ``uid`` held a claim on the eviction's server after its nomination there."""
    return any(
        v.server == eviction.server and v.rv > eviction.nominated_rv and uid in v.uids
        for v in leases
    )


def _broken_since(eviction: Eviction, preemptor: PodLife, windows: Sequence[FaultWindow]) -> bool:
    """Whether a fault took the freed server out between the eviction and the preemptor's
    binding (elsewhere, or never): the server could not take it, and waiting for it would
    have made the preemptor wait out the fault."""
    start = eviction.victim.deleting_at or 0.0
    end = preemptor.bound_at if preemptor.bound_at is not None else float("inf")
    return eviction.server is not None and disturbed(windows, eviction.server, start, end)


def check_no_wasted_evictions(
    found: Sequence[Eviction],
    leases: Sequence[LeaseVersion],
    pods: Mapping[str, PodLife],
    asked: Mapping[str, float],
    windows: Sequence[FaultWindow] = (),
) -> CheckResult:
    """Every evicted pod's preemptor later booked the server it was freed for (a claim in that
    server's Lease), unless the workload deleted the preemptor before it was bound or a fault
    took the freed server out before the preemptor was bound (``windows``)."""
    problems, deleted, broken = [], 0, 0
    for eviction in found:
        who = eviction.victim.key
        preemptor = pods.get(eviction.preemptor or "")
        if preemptor is None:
            problems.append(f"{who} evicted with no nomination naming it")
        elif _booked(leases, eviction, preemptor.uid):
            continue
        elif preemptor.bound_rv is None and preemptor.key in asked:
            deleted += 1
        elif _broken_since(eviction, preemptor, windows):
            broken += 1
        else:
            got = preemptor.server or "nothing"
            problems.append(
                f"{who} evicted from {eviction.server} at rv {eviction.victim.deleting_rv} for "
                f"{preemptor.key}, which never booked it (bound to {got})"
            )
    return CheckResult(
        name=f"every evicted pod's preemptor booked the server freed for it ({len(found)} "
        f"evictions; excused: {deleted} preemptors deleted by the workload, {broken} freed "
        "servers a fault took out)",
        passed=not problems,
        detail="; ".join(problems[:5]),
    )


def _floor(value: int | str, expected: int) -> int:
    if isinstance(value, str):
        return -(-int(value.rstrip("%")) * expected // 100)
    return value


def check_budgets(
    found: Sequence[Eviction], pods: Iterable[PodLife], budgets: Mapping[str, int | str]
) -> CheckResult:
    """No eviction left a budget's pods with fewer healthy than its ``minAvailable``
    (``budgets``: label value → minAvailable; budgets are per namespace)."""
    lives = list(pods)
    problems, covered = [], 0
    for eviction in found:
        victim, rv = eviction.victim, eviction.victim.deleting_rv or 0
        budget = victim.labels.get(BUDGET_LABEL, "")
        if budget not in budgets:
            continue
        covered += 1
        namespace = victim.key.split("/")[0]
        alive = [
            p
            for p in lives
            if p.labels.get(BUDGET_LABEL) == budget
            and p.key.split("/")[0] == namespace
            and p.created_rv < rv
            and (p.end_rv is None or p.end_rv >= rv)
        ]
        healthy = sum(1 for p in alive if p is not victim and p.healthy_at(rv))
        floor = _floor(budgets[budget], len(alive))
        if victim.healthy_at(rv) and healthy < floor:
            problems.append(
                f"{victim.key} evicted at rv {rv}: {healthy} healthy {budget} pods left, "
                f"minAvailable {budgets[budget]} ({floor})"
            )
    return CheckResult(
        name=f"no PodDisruptionBudget violated by an eviction ({covered} evictions under budgets)",
        passed=not problems,
        detail="; ".join(problems[:5]),
    )


def _first_claims(leases: Iterable[LeaseVersion]) -> dict[str, int]:
    first: dict[str, int] = {}
    for version in sorted(leases, key=lambda v: v.rv):
        for uid in version.uids:
            first.setdefault(uid, version.rv)
    return first


def _live(
    nomination: NominationSeen,
    version: LeaseVersion,
    lives: Mapping[str, PodLife],
    first: Mapping[str, int],
) -> bool:
    """Whether the nomination still kept others off when ``version`` was written: not expired
    (judged on the recording time, after the write), its nominee not ended and holding nothing."""
    nominee = lives.get(nomination.uid)
    ended = nominee is not None and nominee.end_rv is not None and nominee.end_rv < version.rv
    booked = first.get(nomination.uid, version.rv) < version.rv
    return version.wall < nomination.expires_at and not ended and not booked


def check_no_inversion(
    leases: Iterable[LeaseVersion], pods: Iterable[PodLife], *, per_card: bool
) -> CheckResult:
    """No pod of lower or equal priority booked a server (its nominated cards, per card) over
    another pod's live nomination."""
    versions = list(leases)
    lives = {p.uid: p for p in pods}
    first = _first_claims(versions)
    problems, nominated = [], 0
    for history in _by_server(versions).values():
        for before, after in itertools.pairwise(history):
            nomination = before.nomination
            if nomination is None:
                continue
            nominated += 1
            held = dict(after.holders)
            for uid in held.keys() - before.uids - {nomination.uid}:
                pod = lives.get(uid)
                clash = not per_card or set(held[uid]) & set(nomination.cards)
                if (
                    pod is not None
                    and pod.priority <= nomination.priority
                    and clash
                    and _live(nomination, after, lives, first)
                ):
                    nominee = lives.get(nomination.uid)
                    problems.append(
                        f"{pod.key} (priority {pod.priority}) booked {after.server} at rv "
                        f"{after.rv} over the nomination of "
                        f"{nominee.key if nominee else nomination.uid} ({nomination.priority})"
                    )
    return CheckResult(
        name=f"no priority inversion: nobody booked over a live nomination "
        f"({nominated} nominated Lease versions)",
        passed=not problems,
        detail="; ".join(problems[:5]),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptionWait:
    """An urgent pod that waited while a server held only by lower priority existed."""

    key: str
    seconds: float | None
    """From the first such moment to its binding; None when it was never bound."""
    limit: float


def _preemptible(
    version: LeaseVersion,
    pod: PodLife,
    lives: Mapping[str, PodLife],
    first: Mapping[str, int],
    at: float,
    windows: Sequence[FaultWindow],
) -> float | None:
    """The holders' longest grace when ``version``'s server was held only by pods of lower
    priority than ``pod`` and promised to nobody else; None otherwise."""
    holders = [lives.get(uid) for uid in version.uids]
    if not holders or any(h is None or h.priority >= pod.priority for h in holders):
        return None
    nomination = version.nomination
    if (
        nomination is not None
        and nomination.uid != pod.uid
        and nomination.priority >= pod.priority
        and _live(nomination, version, lives, first)
    ):
        return None
    if disturbed(windows, version.server, at, at):
        return None
    return max(h.grace_seconds for h in holders if h is not None)


def preemption_waits(
    leases: Iterable[LeaseVersion],
    pods: Iterable[PodLife],
    asked: Mapping[str, float],
    windows: Sequence[FaultWindow],
    erred: frozenset[str] = frozenset(),
    room: Room | None = None,
) -> list[PreemptionWait]:
    """Per pod of priority that was pending while some server was held only by pods of lower
    priority: seconds from the first such moment to its binding. Left out: pods the workload
    deleted unbound, and pods whose scheduling hit an error (``erred``, uids: an extender
    replica killed under the scheduler, a Binding failed by the faults) — they waited for the
    fault. With queues, ``room`` says whether the pod's namespace had room in its quota for
    it just before an rv: a moment without room is not one (preemption never evicts for a
    pod its quota holds back)."""
    versions = sorted(leases, key=lambda v: v.rv)
    history = _History.of(versions)
    lives = {p.uid: p for p in pods}
    first = _first_claims(versions)
    lowest = min((p.priority for p in lives.values()), default=0)
    found = []
    for pod in lives.values():
        if pod.priority <= lowest or pod.uid in erred:
            continue
        moment = _first_moment(history, pod, lives, first, windows, room)
        if moment is None:
            continue
        at, grace = moment
        if pod.bound_at is None and pod.key in asked:
            continue
        seconds = None if pod.bound_at is None else max(0.0, pod.bound_at - at)
        found.append(
            PreemptionWait(key=pod.key, seconds=seconds, limit=grace + PREEMPTION_SLACK_SECONDS)
        )
    return found


@dataclass(frozen=True, slots=True)
class _History:
    """Lease versions in rv order, in all and per server, for bisecting by rv."""

    versions: Sequence[LeaseVersion]
    servers: Mapping[str, Sequence[LeaseVersion]]
    rvs: Sequence[int] = ()
    server_rvs: Mapping[str, Sequence[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, versions: Sequence[LeaseVersion]) -> _History:
        servers = _by_server(versions)
        by_server = {name: [v.rv for v in found] for name, found in servers.items()}
        return cls(versions, servers, [v.rv for v in versions], by_server)

    def before(self, rv: int) -> list[LeaseVersion]:
        """Each server's last version before ``rv``."""
        found = []
        for name, versions in self.servers.items():
            at = bisect.bisect_left(self.server_rvs[name], rv) - 1
            if at >= 0:
                found.append(versions[at])
        return found

    def between(self, low: int, high: int) -> Sequence[LeaseVersion]:
        """Versions with ``low < rv < high``."""
        rvs = self.rvs
        return self.versions[bisect.bisect_right(rvs, low) : bisect.bisect_left(rvs, high)]


def _first_moment(
    history: _History,
    pod: PodLife,
    lives: Mapping[str, PodLife],
    first: Mapping[str, int],
    windows: Sequence[FaultWindow],
    room: Room | None = None,
) -> tuple[float, float] | None:
    """(when, holders' grace) of the first moment ``pod`` was pending beside a preemptible
    server: at its creation, or at a later Lease write before its binding or end."""
    end = min(r for r in (pod.bound_rv, pod.end_rv, 2**63) if r is not None)
    if room is None or room(pod, pod.created_rv):
        for state in history.before(pod.created_rv):
            grace = _preemptible(state, pod, lives, first, pod.created_at, windows)
            if grace is not None:
                return pod.created_at, grace
    for version in history.between(pod.created_rv, end):
        if room is not None and not room(pod, version.rv + 1):
            continue
        grace = _preemptible(version, pod, lives, first, version.at, windows)
        if grace is not None:
            return version.at, grace
    return None


def check_preemption_latency(waits: Sequence[PreemptionWait]) -> CheckResult:
    """Every such pod was bound within its potential victims' grace plus the slack."""
    seconds = [w.seconds for w in waits if w.seconds is not None]
    late = [
        f"{w.key} " + ("never bound" if w.seconds is None else f"{w.seconds:.1f}s > {w.limit:g}s")
        for w in waits
        if w.seconds is None or w.seconds > w.limit
    ]
    return CheckResult(
        name=f"urgent pods bound within their victims' grace + {PREEMPTION_SLACK_SECONDS:g}s: "
        f"{len(waits)} preemptible waits, p50 {percentile(seconds, 50):.2f}s, "
        f"p99 {percentile(seconds, 99):.2f}s, {len(late)} late",
        passed=not late,
        detail="; ".join(late[:5]),
    )


def preemption_summary(
    found: Sequence[Eviction],
    waits: Sequence[PreemptionWait],
    leases: Iterable[LeaseVersion],
    pods: Mapping[str, PodLife],
) -> str:
    """The mix's figures: nominations (booked by their nominee; evicting nobody, as budgets
    refused), evictions, and the preemption latency."""
    nominated = {(v.server, v.nomination.uid) for v in leases if v.nomination is not None}
    booked = sum(1 for server, uid in nominated if uid in pods and pods[uid].server == server)
    evicted_for = {(e.server, e.preemptor) for e in found}
    idle = len(nominated - evicted_for)
    seconds = [w.seconds for w in waits if w.seconds is not None]
    return (
        f"{len(nominated)} nominations ({booked} booked by their nominee, {idle} evicted nobody), "
        f"{len(found)} evictions; latency p50 {percentile(seconds, 50):.2f}s, "
        f"p99 {percentile(seconds, 99):.2f}s ({len(seconds)} urgent pods)"
    )
