"""The soak's PASS/FAIL lines. Each check reads only independent
evidence — the emulated kubelet's records of which server each pod talked to and when, the
apiserver's history of claim Leases and pods, what the workload itself did, and the fault log —
and each can fail: the unit tests feed it a double booking, a lost commit, a leftover claim."""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .checks import CheckResult
from .soak_evidence import LeaseVersion, PodLife
from .soak_faults import FaultWindow

__all__ = [
    "WAKE_LIMIT_SECONDS",
    "LostRule",
    "WakeUp",
    "check_commits_held",
    "check_completion",
    "check_lost_holders",
    "check_no_5xx",
    "check_no_leftover_claims",
    "check_restarts",
    "check_wakeups",
    "disturbed",
    "percentile",
    "wake_seconds",
]

WAKE_LIMIT_SECONDS = 2.0
SERVER_FAULTS = ("lupine-down", "lupine-busy", "node-not-ready", "server-lost")
DOWN_FAULTS = ("lupine-down", "server-lost")
"""Faults during which a pod may fail to start on the server: nothing answers there."""
DIAL_SECONDS = 0.5
"""How long after its start a pod's container may still be dialling its server (the kubelet
records the start, then connects, within milliseconds on a quiet machine): a down window that
began by then may be what it met, as when one fault on a server ends and the next begins in
the moment between the two."""
REASON_LOST = "RemoteGPUServerLost"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``th percentile (inclusive method); NaN when empty."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _held(versions: Sequence[LeaseVersion], life: PodLife) -> str | None:
    """Why ``life``'s claim was not held from its binding to its end; None when it was."""
    assert life.bound_rv is not None
    rvs = [v.rv for v in versions]
    at_bind = bisect.bisect_right(rvs, life.bound_rv) - 1
    if at_bind < 0 or life.uid not in versions[at_bind].uids:
        return f"{life.key}: bound at rv {life.bound_rv} but its claim was not in the Lease"
    end = life.end_rv if life.end_rv is not None else float("inf")
    for version in versions[at_bind + 1 :]:
        if version.rv >= end:
            break
        if life.uid not in version.uids:
            return f"{life.key}: claim gone at rv {version.rv}, pod ended at rv {life.end_rv}"
    return None


def check_commits_held(leases: Iterable[LeaseVersion], pods: Iterable[PodLife]) -> CheckResult:
    """Every pod bound with a committed claim kept it in its server's Lease until it ended."""
    by_server: dict[str, list[LeaseVersion]] = defaultdict(list)
    for version in sorted(leases, key=lambda v: v.rv):
        by_server[version.server].append(version)
    problems, checked = [], 0
    for life in pods:
        if life.bound_rv is None:
            continue
        checked += 1
        server = life.server
        why = (
            f"{life.key}: bound without one server in its annotations"
            if server is None
            else _held(by_server.get(server, []), life)
        )
        if why:
            problems.append(why)
    return CheckResult(
        name=f"every committed claim stayed held until its pod ended ({checked} bound pods)",
        passed=not problems,
        detail="; ".join(problems[:5]),
    )


def check_no_leftover_claims(final: Mapping[str, frozenset[str]], waited: float) -> CheckResult:
    """No Lease holds a claim once every pod is gone."""
    left = {server: uids for server, uids in sorted(final.items()) if uids}
    detail = "; ".join(f"{s}: {', '.join(sorted(u))}" for s, u in left.items())
    return CheckResult(
        name=f"no claim left once every pod was gone (waited {waited:.1f}s)",
        passed=not left,
        detail=detail,
    )


def _faulted(
    windows: Iterable[FaultWindow], target: str, kind: str, at: float, until: float | None = None
) -> bool:
    """Whether a ``kind`` window on ``target`` covers any moment from ``at`` to ``until``."""
    last = at if until is None else until
    return any(
        w.kind == kind and w.target == target and w.start <= last and at <= (w.end or float("inf"))
        for w in windows
    )


def check_completion(
    planned: Iterable[str],
    deleted_by_workload: set[str],
    outcomes: Mapping[str, tuple[str, str, float]],
    windows: Sequence[FaultWindow],
    servers: Mapping[str, str],
    messages: Mapping[str, str] | None = None,
) -> CheckResult:
    """Every planned pod ran to completion unless the workload deleted it.

    ``outcomes``: pod key → (phase, endpoint, start time) from the kubelet. A pod that failed
    to start because its server was down by the fault schedule at that moment is excused.
    ``messages``: the kubelet's word on a failed pod, said beside it (its story starts there).
    """
    missing, failed, excused = [], [], 0
    for key in planned:
        if key in deleted_by_workload:
            continue
        phase, endpoint, started = outcomes.get(key, ("never started", "", 0.0))
        if phase == "Succeeded":
            continue
        server = servers.get(endpoint, "")
        dialled = started + DIAL_SECONDS
        down = any(_faulted(windows, server, kind, started, dialled) for kind in DOWN_FAULTS)
        if phase == "Failed" and down:
            excused += 1
        elif phase == "never started":
            missing.append(key)
        else:
            said = (messages or {}).get(key)
            failed.append(f"{key} {phase}" + (f" ({said})" if said else ""))
    return CheckResult(
        name=f"every pod ran to completion unless the workload deleted it "
        f"({excused} excused: started on a server the faults had taken down)",
        passed=not (missing or failed),
        detail="; ".join([*failed[:5], *(f"{k} never ran" for k in missing[:5])]),
    )


def check_no_5xx(observed: Sequence[str]) -> CheckResult:
    """No 5xx answer from an rgpu service, at any boundary watched."""
    return CheckResult(
        name="no 5xx but the injected", passed=not observed, detail="; ".join(observed[:5])
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeUp:
    """One parked pod's wait from its capacity freeing to its binding, with what a late one
    needs to be read: where, and to whom a nomination promised that server when it freed."""

    key: str
    server: str
    seconds: float
    promised_to: str = ""
    """The nominee's key (or uid, if the evidence never saw it) while the server freed."""

    def describe(self) -> str:
        promise = f", nominated for {self.promised_to}" if self.promised_to else ""
        return f"{self.key} on {self.server} {self.seconds:.2f}s{promise}"


def wake_seconds(
    leases: Iterable[LeaseVersion],
    pods: Iterable[PodLife],
    parked: Mapping[str, float],
    windows: Sequence[FaultWindow],
    *,
    per_card: bool,
) -> list[WakeUp]:
    """For each parked pod (uid → first seen) that waited for its capacity, its wait from that
    capacity freeing to the pod's binding. Capacity frees when the last other pod on its
    server (its cards, per card) has ended and left the Lease; pods whose server was under an
    injected fault meanwhile are left out."""
    by_server: dict[str, list[LeaseVersion]] = defaultdict(list)
    for version in sorted(leases, key=lambda v: v.rv):
        by_server[version.server].append(version)
    lives = {life.uid: life for life in pods}
    waits = []
    for uid, first_seen in parked.items():
        life = lives.get(uid)
        if life is None or life.bound_at is None or life.server is None:
            continue
        freed = max(
            _freed(by_server[life.server], lives, life, unit)
            for unit in (life.cards if per_card else (life.server,))
        )
        if freed[0] <= first_seen or disturbed(windows, life.server, freed[0], life.bound_at):
            continue
        waits.append(_wake_up(life, freed, lives))
    return waits


def _wake_up(
    life: PodLife, freed: tuple[float, LeaseVersion | None], lives: Mapping[str, PodLife]
) -> WakeUp:
    assert life.bound_at is not None and life.server is not None
    at, version = freed
    nominee = version.nomination.uid if version and version.nomination else ""
    nominee_life = lives.get(nominee)
    return WakeUp(
        key=life.key,
        server=life.server,
        seconds=life.bound_at - at,
        promised_to=nominee_life.key if nominee_life else nominee,
    )


def _freed(
    versions: Sequence[LeaseVersion], lives: Mapping[str, PodLife], pod: PodLife, unit: str
) -> tuple[float, LeaseVersion | None]:
    """When ``unit`` was last left by every pod but ``pod`` before ``pod`` was bound, and the
    Lease version that showed it empty."""
    assert pod.bound_rv is not None and pod.bound_at is not None
    bound, others = pod.bound_at, frozenset[str]()
    freed: tuple[float, LeaseVersion | None] = (0.0, None)
    for version in versions:
        if version.rv > pod.bound_rv:
            break
        now = version.holding(unit) - {pod.uid}
        if others and not now:
            ended = [lives[u].end_at for u in others if u in lives]
            at = max([version.at, *(e for e in ended if e is not None and e <= bound)])
            freed = (at, version)
        others = now
    return freed


def disturbed(windows: Iterable[FaultWindow], server: str, start: float, end: float) -> bool:
    """Whether a fault that takes ``server`` out covered any moment from ``start`` to ``end``."""
    return any(
        w.kind in SERVER_FAULTS
        and w.target == server
        and w.start <= end
        and (w.end or float("inf")) >= start
        for w in windows
    )


def check_wakeups(
    waits: Sequence[WakeUp], limit: float = WAKE_LIMIT_SECONDS, *, what: str = "parked pods bound"
) -> CheckResult:
    """Parked pods were bound within ``limit`` seconds of capacity freeing (p99); a failure
    names the slowest. ``what`` names the pods and what happened to them in the line."""
    if not waits:
        return CheckResult(
            name=f"{what} within {limit:g}s of capacity freeing: none to judge, no pod waited "
            "for capacity to free",
            passed=True,
        )
    seconds = sorted(w.seconds for w in waits)
    p50, p99 = percentile(seconds, 50), percentile(seconds, 99)
    late = sorted((w for w in waits if w.seconds > limit), key=lambda w: -w.seconds)
    return CheckResult(
        name=f"{what} within {limit:g}s of capacity freeing: "
        f"{len(waits)} wake-ups, p50 {p50:.2f}s, p99 {p99:.2f}s, {len(late)} over",
        passed=p99 <= limit,
        detail="; ".join([f"p99 {p99:.2f}s", *(w.describe() for w in late[:5])]),
    )


def check_restarts(kills: Counter[str], starts: Mapping[str, int], alive: set[str]) -> CheckResult:
    """Every replica killed came back, and none died that the faults did not kill."""
    by_service: Counter[str] = Counter()
    for name, count in kills.items():
        by_service[name.rsplit("-", 1)[0]] += count
    summary = ", ".join(f"{s} {n}" for s, n in sorted(by_service.items())) or "none"
    unplanned = [n for n, s in starts.items() if s - 1 != kills.get(n, 0) or n not in alive]
    return CheckResult(
        name=f"every killed replica came back (restarts: {summary})",
        passed=not unplanned,
        detail="not running or restarted unplanned: " + ", ".join(sorted(unplanned)),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LostRule:
    """When the soak's holders of a lost server must have been told, and what else."""

    grace: float
    deadline: float
    """Seconds after the server went down by which every holder was told."""
    evict: bool = False


def _alive_at(life: PodLife, moment: float) -> bool:
    """Bound before ``moment`` and neither ended nor being deleted by then."""
    gone = [t for t in (life.end_at, life.deleting_at) if t is not None]
    return (
        life.bound_at is not None
        and life.bound_at <= moment
        and min(gone, default=moment + 1) > moment
    )


def _lost_problem(
    life: PodLife,
    window: FaultWindow,
    rule: LostRule,
    events: Mapping[str, set[str]],
    replacements: Mapping[str, PodLife],
) -> str | None:
    """Why holder ``life`` of the server lost in ``window`` was not handled, if it was not."""
    told = REASON_LOST in events.get(life.uid, set())
    if not rule.evict:
        if _alive_at(life, window.start + rule.deadline) and not told:
            return (
                f"{life.key} held {window.target} past the deadline without a {REASON_LOST} Event"
            )
        return None
    if not _alive_at(life, window.start + rule.grace):
        return None
    evicted = life.deleting_at is not None and (
        life.end_at is None or life.deleting_at <= life.end_at
    )
    if not evicted:
        if _alive_at(life, window.start + rule.deadline):
            return f"{life.key} held lost {window.target} and was not evicted"
        return None
    if not told:
        return f"{life.key} was evicted from {window.target} without a {REASON_LOST} Event"
    again = replacements.get(life.key)
    if again is None or again.bound_at is None:
        return f"{life.key} was evicted from {window.target} and never ran again"
    if again.server == window.target:
        return f"{life.key}'s replacement was placed on lost {window.target} again"
    return None


def check_lost_holders(
    windows: Iterable[FaultWindow],
    pods: Iterable[PodLife],
    events: Mapping[str, set[str]],
    rule: LostRule,
    replacements: Mapping[str, PodLife] | None = None,
) -> CheckResult:
    """Every holder of a server lost under it (the ``server-lost`` fault) got a Warning Event
    within the deadline; with ``evict``, every holder was evicted and its replacement (pod key
    → the pod that replaced it) ran on another server."""
    lives = [life for life in pods if life.server is not None]
    lost = [w for w in windows if w.kind == "server-lost"]
    problems, holders = [], 0
    for window in lost:
        for life in lives:
            if life.server != window.target or not _alive_at(life, window.start):
                continue
            holders += 1
            why = _lost_problem(life, window, rule, events, replacements or {})
            if why:
                problems.append(why)
    action = "told and moved elsewhere" if rule.evict else "told"
    return CheckResult(
        name=f"every holder of a lost server was {action} ({len(lost)} servers lost, "
        f"{holders} holders)",
        passed=not problems,
        detail="; ".join(problems[:5]),
    )
