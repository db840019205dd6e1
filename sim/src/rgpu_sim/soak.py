"""``rgpu soak`` is the proving ground: the whole system, replicated, on
the embedded cluster, under a long seeded stream of pods and the faults a production cluster
throws, ending in PASS/FAIL lines judged from independent evidence (``verdict``). Where ``rgpu
demo`` shows the system working, the soak tries to make it double-book or lose a commit."""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
from rich.console import Console

from .checks import CheckResult, check_endpoints, check_no_sharing
from .soak_driver import Driver, stream
from .soak_evidence import Evidence, record_evidence
from .soak_faults import (
    LOST_DEADLINE_SECONDS,
    LOST_GRACE_SECONDS,
    FaultLog,
    apply_standing_faults,
    run_faults,
)
from .soak_judging import Judged, judge
from .soak_lost import (
    REPLACEMENT_SUFFIX,
    lost_at,
    replace_evicted,
    replacements,
    with_lost_policy,
)
from .soak_plan import SoakPlan, plan_soak
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
from .soak_queues import QueueSetup
from .soak_report import SoakReport, print_soak_report
from .soak_scaling import (
    ScalingEvidence,
    measure_after_drain,
    replica_urls,
    sample_replicas,
    scaling_checks,
)
from .soak_sizing import LOAD
from .soak_trace import save_trace
from .soak_workload import (
    BUDGETS,
    WorkloadShape,
    budget_manifests,
    priority_class_manifests,
)
from .stack import SERVICES, SYSTEM_NAMESPACE, Stack, StackOptions, run_stack
from .stack_rbac import check_authorized
from .steps import Steps
from .verdict import (
    WAKE_LIMIT_SECONDS,
    LostRule,
    check_commits_held,
    check_completion,
    check_lost_holders,
    check_no_5xx,
    check_no_leftover_claims,
    check_restarts,
    check_wakeups,
    percentile,
)

__all__ = [
    "SoakCannotFinish",
    "SoakOptions",
    "SoakReport",
    "plan_for",
    "print_soak_report",
    "run_soak",
]

_EXTENDER_5XX = re.compile(r"code (5\d\d)")
_PASSED_ON_5XX = re.compile(r"\((5\d\d)\): (.*)")
"""A service's 5xx as the extender quotes it to the scheduler: ``(503): <cause>``."""
_INJECTED_CAUSE = re.compile(r": (429|5\d\d) |injected fault")
"""A cause that is the apiserver's injected 429 or 5xx, passed on as retryable."""
_LOGGED_5XX = re.compile(
    r'HTTP Request: (\S+) (\S+) \\"HTTP/[\d.]+ (5\d\d)|Exception in ASGI application'
)
QUEUES_CONFIGMAP = "rgpu-queues"


class SoakCannotFinish(Exception):
    """The soak's plan cannot finish: ``problems`` say why, with the figures."""

    def __init__(self, problems: tuple[str, ...]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakOptions:
    """``rgpu soak``'s knobs."""

    stack: StackOptions = field(default_factory=lambda: StackOptions(replicas=2))
    workload: WorkloadShape = field(default_factory=WorkloadShape)
    faults: bool = True
    wake_limit_seconds: float | None = WAKE_LIMIT_SECONDS
    """None: print the wake-ups in the summary without judging them (a timing verdict on a
    shared machine is not a correctness verdict; the CI soak runs this way)."""
    timeout_seconds: float | None = None
    """The deadline; ``None`` derives it from the workload and the fleet (``soak_sizing``)."""
    trace: Path | None = None
    """Write every pod's scheduling history here (``soak_trace``); needs
    ``stack.trace_scheduler``."""
    admission: str = "gate"
    """``RGPU_ADMISSION`` for every service: ``gate`` (rgpu admits GPU pods behind a
    scheduling gate) or ``filter`` (HAMi's flow: booked inside kube-scheduler's filter)."""
    queues: bool = True
    """The queue workload: namespaces with quotas and weights, and gangs (gate path only)."""
    load: float = LOAD
    """The share of the fleet the stream may ask for; its rate follows (``soak_sizing``)."""
    on_server_lost: str = "keep"
    """The allocator's ``RGPU_ON_SERVER_LOST``; with ``evict`` the workload's owner creates an
    evicted pod again, as its controller would, and the verdict checks it ran elsewhere."""


def _settled(evidence: Evidence, driver: Driver, total: int) -> bool:
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


async def _drain(stack: Stack, driver: Driver, evidence: Evidence) -> float:
    """Delete every pod left (finished ones too) and wait for the claims to go."""
    for key in sorted(driver.created):
        await driver.delete(key)
    ttl = stack.options.booking_ttl_seconds
    started = time.monotonic()
    with anyio.move_on_after(ttl + max(0.2, min(ttl / 3, 10.0)) + 5.0):
        while any(_final_claims(stack, evidence).values()):  # noqa: ASYNC110
            await anyio.sleep(0.2)
    return time.monotonic() - started


def _judged(
    options: SoakOptions,
    stack: Stack,
    plan: SoakPlan,
    driver: Driver,
    evidence: Evidence,
    log: FaultLog,
) -> Judged:
    return judge(
        evidence,
        records=stack.scheduler.records,
        runs=stack.kubelet.records,
        windows=log.windows,
        plan=plan,
        gate=options.admission == "gate",
        evicted={e.victim.key for e in _evictions(evidence, driver)},
        now=time.monotonic(),
    )


def _verdict(
    options: SoakOptions,
    stack: Stack,
    plan: SoakPlan,
    driver: Driver,
    evidence: Evidence,
    log: FaultLog,
    waited: float,
    judged: Judged,
) -> tuple[CheckResult, ...]:
    records = list(stack.kubelet.records.values())
    plans = plan.pods
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
    timing = () if limit is None else (check_wakeups(judged.waits, limit, what=_woken(options)),)
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
            (p.key for p in plans),
            driver.deleted | evicted,
            outcomes,
            log.windows,
            servers,
            {r.key: r.message for r in records if r.message},
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
        *(_priority_checks(evidence, driver, log, per_card, judged) if _mixed(options) else ()),
        *judged.checks,
        check_authorized(stack.sim),
        CheckResult(
            name="the evidence is complete (no watch had to relist)",
            passed=not evidence.gaps,
            detail="; ".join(evidence.gaps[:3]),
        ),
    )


def _woken(options: SoakOptions) -> str:
    """Whose wake-ups the soak measures on its admission path."""
    return "gated pods admitted and bound" if options.admission == "gate" else "parked pods bound"


def _mixed(options: SoakOptions) -> bool:
    return options.workload.priority_share > 0


def _evictions(evidence: Evidence, driver: Driver, log: FaultLog | None = None) -> list[Eviction]:
    """Evictions by preemption; with ``log``, those of holders of a lost server are left out
    (``check_lost_holders`` judges them)."""
    found = evictions(evidence.leases, evidence.pods.values(), driver.asked)
    if log is None:
        return found
    return [e for e in found if not lost_at(log.windows, e.victim)]


def _preemption_waits(
    evidence: Evidence, driver: Driver, log: FaultLog, judged: Judged
) -> list[PreemptionWait]:
    erred = frozenset(uid for uid, rec in driver.stack.scheduler.records.items() if rec.errors)
    return preemption_waits(
        evidence.leases, evidence.pods.values(), driver.asked, log.windows, erred, judged.room
    )


def _priority_checks(
    evidence: Evidence, driver: Driver, log: FaultLog, per_card: bool, judged: Judged
) -> tuple[CheckResult, ...]:
    found = _evictions(evidence, driver, log)
    return (
        check_preemption_latency(_preemption_waits(evidence, driver, log, judged)),
        check_budgets(found, evidence.pods.values(), BUDGETS),
        check_no_wasted_evictions(found, evidence.leases, evidence.pods, driver.asked, log.windows),
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


def plan_for(options: SoakOptions) -> SoakPlan:
    """The soak's plan for ``options`` (no I/O): ``problems`` says why it could not finish."""
    return plan_soak(
        options.stack,
        options.workload,
        queues=options.queues,
        load=options.load,
        timeout_seconds=options.timeout_seconds,
    )


def _stack_options(options: SoakOptions) -> StackOptions:
    """The stack with every service told the admission mode."""
    s = options.stack
    mode = {"RGPU_ADMISSION": options.admission}
    env = {name: {**s.extra_env.get(name, {}), **mode} for name in SERVICES}
    return replace(s, extra_env={**s.extra_env, **env})


def _configure_queues(stack: Stack, setup: QueueSetup) -> None:
    body = {
        "metadata": {"name": QUEUES_CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
        "data": {"queues.yaml": setup.document()},
    }
    stack.sim.store.create("configmaps", body, namespace=SYSTEM_NAMESPACE)


def _header(options: SoakOptions, plan: SoakPlan) -> str:
    s = options.stack
    queues = f"queues ({plan.queues.describe()})" if plan.queues is not None else "no queues"
    return (
        f"[bold]rgpu soak[/]: {s.servers} servers x {s.cards} cards, {s.clients} clients, "
        f"{len(plan.pods)} pods, {s.replicas} replicas, granularity [cyan]{s.granularity}[/], "
        f"admission {options.admission}, {queues}, "
        f"faults {'standard' if options.faults else 'none'}, ttl {s.booking_ttl_seconds:g}s, "
        f"priority mix {options.workload.priority_share:g}, "
        f"lost servers {options.on_server_lost}, seed {s.seed}\n"
        f"  {plan.sizing.describe()}"
    )


async def run_soak(
    options: SoakOptions, console: Console, plan: SoakPlan | None = None
) -> SoakReport:
    """Run the soak to its verdict; every process is stopped on the way out. Raises
    ``SoakCannotFinish`` before anything starts when the plan says it could not finish."""
    plan = plan or plan_for(options)
    if plan.problems:
        raise SoakCannotFinish(plan.problems)
    plans, s = plan.pods, options.stack
    console.print(_header(options, plan), soft_wrap=True, highlight=False)
    evidence, log = Evidence(), FaultLog()
    scaling = ScalingEvidence(replicas=s.replicas)
    clock = _Phases()
    with Steps(console) as steps:
        stack_options = with_lost_policy(_stack_options(options), options.on_server_lost)
        async with run_stack(stack_options, progress=steps) as stack:
            clock.end("start-up")
            driver = Driver(stack)
            _prepare(stack, options, plan)
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
                    work.start_soon(stream, driver, plans)
                    deadline = plan.sizing.deadline_seconds
                    await _progress(evidence, driver, len(plans), steps, deadline)
                    work.cancel_scope.cancel()
                steps("healing the injected faults")
                await _heal(stack)
                clock.end("workload")
                steps(f"draining: deleting {len(driver.created)} pods, waiting for their claims")
                waited = await _drain(stack, driver, evidence)
                steps("judging the evidence")
                judged = _judged(options, stack, plan, driver, evidence, log)
                checks = _verdict(options, stack, plan, driver, evidence, log, waited, judged)
                # After the verdict: the write window plants stale claims the checks above must
                # not see.
                steps("measuring probes and background writes after the drain")
                await measure_after_drain(stack, scaling, SYSTEM_NAMESPACE)
                checks = (*checks, *scaling_checks(scaling))
                clock.end("drain and checks")
                tg.cancel_scope.cancel()
            steps.pause()
            if options.trace is not None:
                save_trace(
                    options.trace,
                    stack.scheduler.records.values(),
                    started,
                    console,
                    evidence.said,
                    log.windows,
                )
            lives = evidence.pods.values()
            report = SoakReport(
                pods=len(plans),
                wall_seconds=clock.total(),
                phases=clock.phases(),
                bound=sum(1 for life in lives if life.bound_rv is not None),
                succeeded=sum(1 for r in stack.kubelet.records.values() if r.phase == "Succeeded"),
                deleted=len(driver.deleted),
                waits=tuple(w.seconds for w in judged.waits),
                woken=_woken(options),
                faults=dict(Counter(w.kind for w in log.windows)),
                checks=checks,
                preemption=preemption_summary(
                    _evictions(evidence, driver),
                    _preemption_waits(evidence, driver, log, judged),
                    evidence.leases,
                    evidence.pods,
                )
                if _mixed(options)
                else "",
                scheduler=_scheduler_waits(stack),
                cycles=judged.cycles.describe(),
                queues=judged.queues,
            )
            steps("stopping every process")
    return report


def _prepare(stack: Stack, options: SoakOptions, plan: SoakPlan) -> None:
    """The namespaces, the priority mix's classes and budgets, and the queues' ConfigMap."""
    for namespace in plan.shape.namespaces:
        if namespace != "default":
            stack.sim.store.create("namespaces", {"metadata": {"name": namespace}})
    if _mixed(options):
        _create_mix(stack, plan.shape.namespaces)
    if plan.queues is not None:
        _configure_queues(stack, plan.queues)


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
    evidence: Evidence, driver: Driver, total: int, steps: Steps, timeout: float
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
