"""``rgpu soak`` is the proving ground: the whole system, replicated, on
the embedded cluster, under a long seeded stream of pods and the faults a production cluster
throws, ending in PASS/FAIL lines judged from independent evidence (``verdict``). Where ``rgpu
demo`` shows the system working, the soak tries to make it double-book or lose a commit."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
from rich.console import Console
from rich.table import Table

from .checks import CheckResult, check_endpoints, check_no_sharing
from .soak_evidence import Evidence, record_evidence
from .soak_faults import (
    LOST_DEADLINE_SECONDS,
    LOST_GRACE_SECONDS,
    FaultLog,
    apply_standing_faults,
    run_faults,
)
from .soak_lost import (
    REPLACEMENT_SUFFIX,
    lost_at,
    replace_evicted,
    replacements,
    with_lost_policy,
)
from .soak_priority import (
    Eviction,
    PreemptionWait,
    check_budgets,
    check_no_inversion,
    check_no_wasted_evictions,
    check_preemption_latency,
    evictions,
    preemption_summary,
    preemption_waits,
)
from .soak_scaling import (
    ScalingEvidence,
    measure_after_drain,
    replica_urls,
    sample_replicas,
    scaling_checks,
)
from .soak_trace import save_trace
from .soak_workload import (
    BUDGETS,
    SoakPod,
    WorkloadShape,
    budget_manifests,
    plan_soak_workload,
    priority_class_manifests,
)
from .stack import SYSTEM_NAMESPACE, Stack, StackOptions, run_stack
from .stack_rbac import check_authorized
from .steps import Steps
from .verdict import (
    WAKE_LIMIT_SECONDS,
    LostRule,
    WakeUp,
    check_commits_held,
    check_completion,
    check_lost_holders,
    check_no_5xx,
    check_no_leftover_claims,
    check_restarts,
    check_wakeups,
    percentile,
    wake_seconds,
)

__all__ = ["SoakOptions", "SoakReport", "print_soak_report", "run_soak"]

_EXTENDER_5XX = re.compile(r"code (5\d\d)")
_PASSED_ON_5XX = re.compile(r"\((5\d\d)\): (.*)")
"""A service's 5xx as the extender quotes it to the scheduler: ``(503): <cause>``."""
_INJECTED_CAUSE = re.compile(r": (429|5\d\d) |injected fault")
"""A cause that is the apiserver's injected 429 or 5xx, passed on as retryable."""
_LOGGED_5XX = re.compile(
    r'HTTP Request: (\S+) (\S+) \\"HTTP/[\d.]+ (5\d\d)|Exception in ASGI application'
)
_RETRY_SECONDS = 60.0
"""How long the workload's owner keeps retrying a create or delete the apiserver refuses."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakOptions:
    """``rgpu soak``'s knobs."""

    stack: StackOptions = field(default_factory=lambda: StackOptions(replicas=2))
    workload: WorkloadShape = field(default_factory=WorkloadShape)
    faults: bool = True
    wake_limit_seconds: float | None = WAKE_LIMIT_SECONDS
    """None: print the wake-ups in the summary without judging them (a timing verdict on a
    shared machine is not a correctness verdict; the CI soak runs this way)."""
    timeout_seconds: float = 900.0
    trace: Path | None = None
    """Write every pod's scheduling history here (``soak_trace``); needs
    ``stack.trace_scheduler``."""
    on_server_lost: str = "keep"
    """The allocator's ``RGPU_ON_SERVER_LOST``; with ``evict`` the workload's owner creates an
    evicted pod again, as its controller would, and the verdict checks it ran elsewhere."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakReport:
    """What the soak measured, and its verdict."""

    pods: int
    wall_seconds: float
    """From the command's start to the verdict: start-up, workload, drain and checks."""
    bound: int
    succeeded: int
    deleted: int
    waits: tuple[float, ...]
    faults: dict[str, int]
    checks: tuple[CheckResult, ...]
    phases: tuple[tuple[str, float], ...] = ()
    """Where ``wall_seconds`` went, phase by phase."""
    preemption: str = ""
    """The priority mix's figures (empty without it)."""
    scheduler: str = ""
    """The scheduler emulator's waits (each extender verb, each scheduling cycle): a parked
    pod's wake-up queues behind the cycles of every pod ahead of it."""

    @property
    def ok(self) -> bool:
        return all(check.passed for check in self.checks)


@dataclass(slots=True)
class _Driver:
    """The workload's owner: creates pods, deletes the ones it means to, notes what it saw."""

    stack: Stack
    deleted: set[str] = field(default_factory=set)
    created: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)
    """Pods never created: their keys."""
    server_errors: list[str] = field(default_factory=list)
    asked: dict[str, float] = field(default_factory=dict)
    """Pod key → when the workload first sent its DELETE (monotonic)."""

    async def _send(
        self, key: str, send: Callable[[], Awaitable[httpx.Response]]
    ) -> httpx.Response | None:
        deadline = time.monotonic() + _RETRY_SECONDS
        delay = 0.1
        while time.monotonic() < deadline:
            response: httpx.Response | None
            try:
                response = await send()
            except httpx.HTTPError:
                response = None
            if response is not None and response.status_code < 500 and response.status_code != 429:
                return response
            if response is not None and "(HTTP 5" in response.text:
                self.server_errors.append(f"webhook answered 5xx for {key}: {response.text[:200]}")
            await anyio.sleep(delay)
            delay = min(delay * 2, 2.0)
        self.errors.append(f"{key}: the apiserver kept refusing for {_RETRY_SECONDS:g}s")
        return None

    async def _create(self, pod: SoakPod) -> httpx.Response | None:
        response = await self._send(pod.key, lambda: self.stack.create_pod(pod.manifest()))
        if (
            response is not None
            and response.status_code == 409
            and "AlreadyExists" in response.text
        ):
            # Names are unique in a soak: an earlier attempt whose answer was lost (a timeout
            # under load) created it. Carry on with the pod as stored.
            namespace, name = pod.key.split("/")
            stored = await self._send(
                pod.key,
                lambda: self.stack.apiserver.get(f"/api/v1/namespaces/{namespace}/pods/{name}"),
            )
            if stored is not None and stored.status_code == 200:
                return httpx.Response(201, json=stored.json())
        return response

    async def run_pod(self, pod: SoakPod) -> None:
        response = await self._create(pod)
        if response is None or response.status_code != 201:
            self.refused.add(pod.key)
        if response is None:
            return
        if response.status_code != 201:
            self.errors.append(f"{pod.key}: {response.status_code} {response.text[:200]}")
            return
        self.created.add(pod.key)
        uid = str(response.json()["metadata"]["uid"])
        if pod.fate == "delete-running":
            while uid not in self.stack.kubelet.records:  # noqa: ASYNC110 (an emulator's record)
                await anyio.sleep(0.05)
            await anyio.sleep(pod.delete_after_seconds)
        elif pod.fate == "delete-pending":
            await anyio.sleep(pod.delete_after_seconds)
        else:
            return
        self.deleted.add(pod.key)
        await self.delete(pod.key)

    async def delete(self, key: str) -> None:
        namespace, name = key.split("/")
        self.asked.setdefault(key, time.monotonic())
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        await self._send(key, lambda: self.stack.apiserver.delete(path))


async def _stream(driver: _Driver, plans: tuple[SoakPod, ...]) -> None:
    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        for pod in plans:
            await anyio.sleep(max(0.0, start + pod.arrival_seconds - time.monotonic()))
            tg.start_soon(driver.run_pod, pod)


def _settled(evidence: Evidence, driver: _Driver, total: int) -> bool:
    ended = {life.key for life in evidence.pods.values() if life.end_rv is not None}
    # Replacements of evicted pods must end too, but do not stand for planned pods.
    planned = {
        key for key in driver.created | driver.refused if not key.endswith(REPLACEMENT_SUFFIX)
    }
    return len(planned) >= total and driver.created <= ended


async def _heal(stack: Stack) -> None:
    """After the faults: every replica running, every server answering, the apiserver clean."""
    stack.sim.faults.clear()
    for name, process in stack.services.items():
        if not process.alive():
            await stack.start(name)
    for lupine in stack.fleet.lupine:
        if lupine.fault is not None:
            await lupine.set_fault(None)


def _final_claims(stack: Stack, evidence: Evidence) -> dict[str, frozenset[str]]:
    latest: dict[str, frozenset[str]] = {}
    for version in sorted(evidence.leases, key=lambda v: v.rv):
        latest[version.server] = version.uids
    return latest


async def _drain(stack: Stack, driver: _Driver, evidence: Evidence) -> float:
    """Delete every pod left (finished ones too) and wait for the claims to go."""
    for key in sorted(driver.created):
        await driver.delete(key)
    ttl = stack.options.booking_ttl_seconds
    started = time.monotonic()
    with anyio.move_on_after(ttl + max(0.2, min(ttl / 3, 10.0)) + 5.0):
        while any(_final_claims(stack, evidence).values()):  # noqa: ASYNC110
            await anyio.sleep(0.2)
    return time.monotonic() - started


def _verdict(
    options: SoakOptions,
    stack: Stack,
    plans: tuple[SoakPod, ...],
    driver: _Driver,
    evidence: Evidence,
    log: FaultLog,
    waited: float,
) -> tuple[CheckResult, ...]:
    records = list(stack.kubelet.records.values())
    per_card = stack.options.granularity == "card"
    servers = {endpoint: name for name, endpoint in stack.fleet.endpoints().items()}
    evicted = {e.victim.key for e in _evictions(evidence, driver)}
    outcomes = {r.key: (r.phase, r.endpoint, r.started_at) for r in records}
    extender_5xx = [
        f"{rec.key}: {error}"
        for rec in stack.scheduler.records.values()
        for error in rec.errors
        if _EXTENDER_5XX.search(error) or _uninjected_5xx(error)
    ]
    kills = Counter(w.target for w in log.windows if w.kind == "kill-9")
    alive = {name for name, p in stack.services.items() if p.alive()}
    starts = {name: p.starts for name, p in stack.services.items()}
    limit = options.wake_limit_seconds
    waits = _waits(stack, evidence, log, per_card)
    timing = () if limit is None else (check_wakeups(waits, limit),)
    return (
        CheckResult(
            name="every pod was created (the webhook admitted it)",
            passed=not driver.errors,
            detail="; ".join(driver.errors[:3]),
        ),
        check_no_sharing(records, time.monotonic(), per_card=per_card),
        check_endpoints(records, stack.fleet.endpoints()),
        check_commits_held(evidence.leases, evidence.pods.values()),
        check_no_leftover_claims(_final_claims(stack, evidence), waited),
        check_completion(
            (p.key for p in plans), driver.deleted | evicted, outcomes, log.windows, servers
        ),
        check_no_5xx([*driver.server_errors, *extender_5xx, *_logged_5xx(stack)]),
        check_lost_holders(
            log.windows,
            evidence.pods.values(),
            evidence.events,
            LostRule(
                grace=LOST_GRACE_SECONDS,
                deadline=LOST_DEADLINE_SECONDS,
                evict=options.on_server_lost == "evict",
            ),
            replacements(evidence),
        ),
        *timing,
        check_restarts(kills, starts, alive),
        *(_priority_checks(evidence, driver, log, per_card) if _mixed(options) else ()),
        check_authorized(stack.sim),
        CheckResult(
            name="the evidence is complete (no watch had to relist)",
            passed=not evidence.gaps,
            detail="; ".join(evidence.gaps[:3]),
        ),
    )


def _mixed(options: SoakOptions) -> bool:
    return options.workload.priority_share > 0


def _evictions(evidence: Evidence, driver: _Driver, log: FaultLog | None = None) -> list[Eviction]:
    """Evictions by preemption; with ``log``, those of holders of a lost server are left out
    (``check_lost_holders`` judges them)."""
    found = evictions(evidence.leases, evidence.pods.values(), driver.asked)
    if log is None:
        return found
    return [e for e in found if not lost_at(log.windows, e.victim)]


def _preemption_waits(evidence: Evidence, driver: _Driver, log: FaultLog) -> list[PreemptionWait]:
    erred = frozenset(uid for uid, rec in driver.stack.scheduler.records.items() if rec.errors)
    return preemption_waits(
        evidence.leases, evidence.pods.values(), driver.asked, log.windows, erred
    )


def _priority_checks(
    evidence: Evidence, driver: _Driver, log: FaultLog, per_card: bool
) -> tuple[CheckResult, ...]:
    found = _evictions(evidence, driver, log)
    return (
        check_preemption_latency(_preemption_waits(evidence, driver, log)),
        check_budgets(found, evidence.pods.values(), BUDGETS),
        check_no_wasted_evictions(found, evidence.leases, evidence.pods, driver.asked),
        check_no_inversion(evidence.leases, evidence.pods.values(), per_card=per_card),
    )


def _create_mix(stack: Stack, namespaces: tuple[str, ...]) -> None:
    for manifest in priority_class_manifests():
        stack.sim.store.create("priorityclasses", manifest)
    for namespace in namespaces:
        for manifest in budget_manifests(namespace):
            stack.sim.store.create("poddisruptionbudgets", manifest)


def _uninjected_5xx(error: str) -> bool:
    match = _PASSED_ON_5XX.search(error)
    return match is not None and not _INJECTED_CAUSE.search(match.group(2))


def _logged_5xx(stack: Stack) -> list[str]:
    """5xx answers between services (their HTTP clients log every answer) and unhandled
    exceptions in any service; the apiserver's own 5xx are the injected ones."""
    found = []
    for path in sorted(stack.work_dir.rglob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            match = _LOGGED_5XX.search(line)
            if match and not (match.group(2) or "").startswith(stack.sim.url):
                found.append(f"{path.parent.name}/{path.name}: {match.group(0)}")
    return found


def _waits(stack: Stack, evidence: Evidence, log: FaultLog, per_card: bool) -> list[WakeUp]:
    # A pod whose scheduling hit an error (an extender replica killed under it, a Binding
    # failed by the faults) waited for the fault, not for rgpu: its wake-up is not rgpu's.
    parked = {
        uid: rec.first_seen
        for uid, rec in stack.scheduler.records.items()
        if rec.refusals and not rec.errors
    }
    return wake_seconds(
        evidence.leases, evidence.pods.values(), parked, log.windows, per_card=per_card
    )


async def run_soak(options: SoakOptions, console: Console) -> SoakReport:
    """Run the soak to its verdict; every process is stopped on the way out."""
    plans = plan_soak_workload(options.workload)
    s = options.stack
    console.print(
        f"[bold]rgpu soak[/]: {s.servers} servers x {s.cards} cards, {s.clients} clients, "
        f"{len(plans)} pods, {s.replicas} replicas, granularity [cyan]{s.granularity}[/], "
        f"faults {'standard' if options.faults else 'none'}, ttl {s.booking_ttl_seconds:g}s, "
        f"priority mix {options.workload.priority_share:g}, "
        f"lost servers {options.on_server_lost}, seed {s.seed}"
    )
    evidence, log = Evidence(), FaultLog()
    scaling = ScalingEvidence(replicas=s.replicas)
    clock = _Phases()
    with Steps(console) as steps:
        stack_options = with_lost_policy(options.stack, options.on_server_lost)
        async with run_stack(stack_options, progress=steps) as stack:
            clock.end("start-up")
            driver = _Driver(stack)
            for namespace in options.workload.namespaces:
                if namespace != "default":
                    stack.sim.store.create("namespaces", {"metadata": {"name": namespace}})
            if _mixed(options):
                _create_mix(stack, options.workload.namespaces)
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                await tg.start(record_evidence, stack.sim, evidence, SYSTEM_NAMESPACE)
                await tg.start(
                    sample_replicas,
                    stack.apiserver,
                    replica_urls(stack, "discovery"),
                    replica_urls(stack, "metrics"),
                    scaling,
                )
                async with anyio.create_task_group() as work:
                    if options.faults:
                        apply_standing_faults(stack, log)
                        work.start_soon(run_faults, stack, log, s.seed)
                    if options.on_server_lost == "evict":
                        work.start_soon(
                            replace_evicted, driver.run_pod, driver.asked, evidence, plans, log
                        )
                    work.start_soon(_stream, driver, plans)
                    await _progress(evidence, driver, len(plans), steps, options.timeout_seconds)
                    work.cancel_scope.cancel()
                steps("healing the injected faults")
                await _heal(stack)
                clock.end("workload")
                steps(f"draining: deleting {len(driver.created)} pods, waiting for their claims")
                waited = await _drain(stack, driver, evidence)
                steps("judging the evidence")
                checks = _verdict(options, stack, plans, driver, evidence, log, waited)
                # After the verdict: the write window plants stale claims the checks above must
                # not see.
                steps("measuring probes and background writes after the drain")
                await measure_after_drain(stack, scaling, SYSTEM_NAMESPACE)
                checks = (*checks, *scaling_checks(scaling))
                clock.end("drain and checks")
                tg.cancel_scope.cancel()
            steps.pause()
            if options.trace is not None:
                save_trace(options.trace, stack.scheduler.records.values(), started, console)
            lives = evidence.pods.values()
            report = SoakReport(
                pods=len(plans),
                wall_seconds=clock.total(),
                phases=clock.phases(),
                bound=sum(1 for life in lives if life.bound_rv is not None),
                succeeded=sum(1 for r in stack.kubelet.records.values() if r.phase == "Succeeded"),
                deleted=len(driver.deleted),
                waits=tuple(
                    w.seconds
                    for w in _waits(stack, evidence, log, stack.options.granularity == "card")
                ),
                faults=dict(Counter(w.kind for w in log.windows)),
                checks=checks,
                preemption=preemption_summary(
                    _evictions(evidence, driver),
                    _preemption_waits(evidence, driver, log),
                    evidence.leases,
                    evidence.pods,
                )
                if _mixed(options)
                else "",
                scheduler=_scheduler_waits(stack),
            )
            steps("stopping every process")
    return report


_PROGRESS_SECONDS = 2.0
"""How often the workload's progress is refreshed: no wait longer than this goes unsaid."""


class _Phases:
    """Wall time from the soak's start, cut into named phases as each ends."""

    def __init__(self) -> None:
        self._start = self._last = time.monotonic()
        self._phases: list[tuple[str, float]] = []

    def end(self, name: str) -> None:
        now = time.monotonic()
        self._phases.append((name, now - self._last))
        self._last = now

    def total(self) -> float:
        return self._last - self._start

    def phases(self) -> tuple[tuple[str, float], ...]:
        return tuple(self._phases)


def _scheduler_waits(stack: Stack) -> str:
    waits = stack.scheduler.latencies()
    return ", ".join(
        f"{verb} {percentile(kept, 50) * 1000:.0f}/{percentile(kept, 99) * 1000:.0f}"
        for verb, kept in waits.items()
        if kept
    )


async def _progress(
    evidence: Evidence, driver: _Driver, total: int, steps: Steps, timeout: float
) -> None:
    started = time.monotonic()
    steps(f"workload: {total} pods")
    with anyio.move_on_after(timeout):
        while not _settled(evidence, driver, total):
            await anyio.sleep(_PROGRESS_SECONDS)
            ended = sum(1 for life in evidence.pods.values() if life.end_rv is not None)
            took = time.monotonic() - started
            steps.update(
                f"workload: {len(driver.created)}/{total} created, {ended} ended ({took:.0f}s)"
            )


def print_soak_report(report: SoakReport, console: Console) -> None:
    """The summary and the PASS/FAIL lines."""
    table = Table(title="rgpu soak summary", show_header=False)
    table.add_row(
        "pods",
        f"{report.pods} planned, {report.bound} bound, {report.succeeded} succeeded, "
        f"{report.deleted} deleted by the workload",
    )
    phases = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in report.phases)
    table.add_row("wall time", f"{report.wall_seconds:.1f}s" + (f" ({phases})" if phases else ""))
    table.add_row(
        "wake-up (capacity freed → bound)",
        f"p50 {percentile(report.waits, 50):.2f}s, p99 {percentile(report.waits, 99):.2f}s "
        f"({len(report.waits)} parked pods)",
    )
    if report.preemption:
        table.add_row("preemption", report.preemption)
    if report.scheduler:
        table.add_row("scheduler (ms p50/p99)", report.scheduler)
    table.add_row(
        "faults injected", ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items())) or "none"
    )
    console.print(table)
    for check in report.checks:
        mark = "[green]PASS[/]" if check.passed else "[red]FAIL[/]"
        detail = f" — {check.detail}" if check.detail and not check.passed else ""
        console.print(f"{mark} {check.name}{detail}", soft_wrap=True, highlight=False)
