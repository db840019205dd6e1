"""With admission by scheduling gate, rgpu promises three things the soak can check from what
the apiserver stored and what the scheduler emulator saw, never from rgpu's own books: a GPU pod
reaches kube-scheduler only once it is admitted (its claim written, then rgpu's gate lifted), so
the first ``/filter`` of it finds the booking and one scheduling cycle binds it; and a pod
waiting behind the gate costs nothing — nobody nudges it (``rgpu.io/retry-at``, the filter
path's way of sending kube-scheduler back to a refused pod).

Claims are followed through every Lease version (``ClaimHistory``), so "booked when its gate was
lifted" is a comparison of resourceVersions, one clock for pods and Leases alike. Each check
fails on what it exists to catch (``cli/tests/test_soak_admission.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rgpu_kubesim import PodRecord

from .checks import CheckResult
from .soak_evidence import LeaseVersion, PodLife

__all__ = [
    "CYCLES_LIMIT",
    "ClaimHistory",
    "ClaimSpan",
    "Cycles",
    "check_admitted_before_filter",
    "check_cycles",
    "check_no_gated_nudge",
    "count_cycles",
    "gated_parked",
]

CYCLES_LIMIT = 1.1
"""Scheduler cycles per bound GPU pod on the gate path: an admitted pod binds in its first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimSpan:
    """One stretch of Lease versions in which a pod held a claim on one server: from the
    version that added it to the one that removed it (``None``: never removed)."""

    server: str
    start_rv: int
    start_at: float
    cards: int
    end_rv: int | None = None
    end_at: float | None = None

    def covers(self, rv: int) -> bool:
        """Whether the claim was in the Lease as it stood just before ``rv``."""
        return self.start_rv < rv and (self.end_rv is None or self.end_rv >= rv)


@dataclass(slots=True)
class ClaimHistory:
    """Every pod's claims through the Lease versions, by pod uid."""

    spans: dict[str, list[ClaimSpan]] = field(default_factory=dict)

    @classmethod
    def of(cls, leases: Iterable[LeaseVersion]) -> ClaimHistory:
        history = cls()
        held: dict[str, dict[str, ClaimSpan]] = defaultdict(dict)
        for version in sorted(leases, key=lambda v: v.rv):
            now = dict(version.holders)
            current = held[version.server]
            for uid in [u for u in current if u not in now]:
                span = current.pop(uid)
                closed = ClaimSpan(
                    server=span.server,
                    start_rv=span.start_rv,
                    start_at=span.start_at,
                    cards=span.cards,
                    end_rv=version.rv,
                    end_at=version.at,
                )
                history.spans[uid][-1] = closed
            for uid, cards in now.items():
                if uid not in current:
                    span = ClaimSpan(
                        server=version.server,
                        start_rv=version.rv,
                        start_at=version.at,
                        cards=len(cards),
                    )
                    current[uid] = span
                    history.spans.setdefault(uid, []).append(span)
        return history

    def held(self, uid: str, rv: int) -> ClaimSpan | None:
        """The claim ``uid`` held in the Leases as they stood just before ``rv``."""
        return next((s for s in self.spans.get(uid, ()) if s.covers(rv)), None)

    def first(self, uid: str) -> ClaimSpan | None:
        found = self.spans.get(uid)
        return found[0] if found else None

    def kept(self, uid: str, since: int, until: int) -> bool:
        """Whether one claim of ``uid`` stood from before ``since`` until ``until``."""
        span = self.held(uid, since)
        return span is not None and span.covers(until)


def check_admitted_before_filter(
    lives: Iterable[PodLife], filtered: Mapping[str, int], claims: ClaimHistory
) -> CheckResult:
    """Every GPU pod was admitted before rgpu's ``/filter`` first saw it: created behind
    rgpu's gate, its claim in a Lease when the gate was lifted, and the pod version that first
    /filter carried already without the gate (``filtered``: uid → that version's rv)."""
    problems, checked = [], 0
    for life in lives:
        rv = filtered.get(life.uid)
        if rv is None:
            continue
        checked += 1
        if not life.gated:
            problems.append(f"{life.key} reached /filter without rgpu's gate")
        elif life.lifted_rv is None or life.lifted_rv > rv:
            problems.append(f"{life.key} reached /filter at rv {rv} while still gated")
        elif claims.held(life.uid, life.lifted_rv) is None:
            problems.append(f"{life.key}: gate lifted at rv {life.lifted_rv} with no claim booked")
    return CheckResult(
        name=f"every GPU pod was admitted (claim booked, gate lifted) before any /filter of it "
        f"({checked} pods filtered)",
        passed=not problems,
        detail="; ".join(problems[:5]),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Cycles:
    """Scheduler cycles spent on bound GPU pods."""

    pods: int
    cycles: int
    lapsed: int = 0
    """Left out: the booking made at admission was gone before the binding."""
    erred: int = 0
    """Left out: the pod's scheduling hit an error (a fault, a replica killed under it)."""
    worst: tuple[str, ...] = ()
    """The pods that took the most cycles, with their last refusal."""

    @property
    def per_pod(self) -> float:
        return self.cycles / self.pods if self.pods else 0.0

    def describe(self) -> str:
        return (
            f"{self.per_pod:.3f} per bound GPU pod ({self.cycles} cycles, {self.pods} pods; "
            f"left out: {self.lapsed} whose booking lapsed, {self.erred} whose scheduling "
            "hit an error)"
        )


def count_cycles(
    lives: Iterable[PodLife], records: Mapping[str, PodRecord], claims: ClaimHistory, *, gate: bool
) -> Cycles:
    """Cycles per bound GPU pod. On the gate path a pod whose admission booking lapsed before
    its binding (it took the filter path) is left out; so, on both paths, is a pod whose
    scheduling hit an error."""
    pods = cycles = lapsed = erred = 0
    spent: list[tuple[int, str]] = []
    for life in lives:
        record = records.get(life.uid)
        if record is None or life.bound_rv is None or record.attempts == 0:
            continue
        if record.errors:
            erred += 1
            continue
        if gate and not (
            life.lifted_rv is not None and claims.kept(life.uid, life.lifted_rv, life.bound_rv)
        ):
            lapsed += 1
            continue
        pods += 1
        cycles += record.attempts
        if record.attempts > 1:
            spent.append((record.attempts, f"{life.key} {record.attempts} ({record.last_message})"))
    worst = tuple(text for _, text in sorted(spent, key=lambda s: -s[0])[:5])
    return Cycles(pods=pods, cycles=cycles, lapsed=lapsed, erred=erred, worst=worst)


def check_cycles(found: Cycles, limit: float = CYCLES_LIMIT) -> CheckResult:
    """An admitted pod binds in its first scheduling cycle: at most ``limit`` per pod."""
    return CheckResult(
        name=f"scheduler cycles per bound GPU pod at most {limit:g}: {found.describe()}",
        passed=found.per_pod <= limit,
        detail="; ".join(found.worst),
    )


def check_no_gated_nudge(lives: Iterable[PodLife]) -> CheckResult:
    """No pod was nudged (``rgpu.io/retry-at`` written) while it carried rgpu's gate."""
    gated = nudged = 0
    problems = []
    for life in lives:
        gated += life.gated
        if life.nudges:
            nudged += 1
            problems.append(f"{life.key} nudged at rv {', '.join(map(str, life.nudges[:3]))}")
    return CheckResult(
        name=f"no gated pod was nudged ({gated} pods waited behind rgpu's gate, {nudged} nudged)",
        passed=not problems,
        detail="; ".join(problems[:5]),
    )


def gated_parked(lives: Iterable[PodLife], erred: frozenset[str]) -> dict[str, float]:
    """The pods whose wake-up the gate path judges: every pod created behind rgpu's gate
    (uid → creation, as recorded), but those whose scheduling hit an error. Which of them
    waited for capacity is ``verdict.wake_seconds``'s to say (its server freed after it came)."""
    return {life.uid: life.created_at for life in lives if life.gated and life.uid not in erred}
