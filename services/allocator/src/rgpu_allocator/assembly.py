"""The allocator's parts and how they are joined: each part built once from the settings and
the clients the lifespan opened, the background reactions declared in one table
(``reactions``), and the tasks started in the order their readiness depends on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx
from anyio.abc import TaskGroup
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from rgpu_placement import FleetView
from rgpu_runtime.feeds import DiscoveryMirror
from rgpu_runtime.kube import EventRecorder, KubeClient, Reflector
from rgpu_runtime.replicas import Election, ElectionTiming
from rgpu_runtime.serving import Readiness

from .admitting import Admitter
from .answers import Answers
from .booker import Booker
from .booking import Booking
from .claims import MANAGED_BY_SELECTOR, LeaseRecord
from .clients import COMPONENT, DiscoveryClient, KubeApi
from .committing import Committer
from .deciding import Decider
from .growth import wake_on_growth
from .instruments import Instruments
from .judging import Judge
from .leases import Finder, LeaseWriter
from .ledger import Ledger
from .lost import LostPolicy, LostServers
from .lupine_pods import lupine_api
from .nudging import Nudger
from .planning import Planner
from .pods import PodIndex, PodInfo
from .policy import Policy
from .preempting import Preemptor
from .published import PublishedClaims
from .queues import Queues, Version, queues_reflector
from .reactions import Signal, Signals
from .readiness import KubeGates
from .refusing import Checks, Refusals
from .removal import Remover
from .repair import Repairer
from .revalidation import Reprober, Revalidator
from .routes import Deps
from .server_policies import ServerPolicies
from .settings import AllocatorSettings
from .sweeping import Reconciler, Sweeper
from .waiters import Refused, Waiting
from .watching import LeaseHooks, cache_trust, lease_reflector, pod_reflector, watch_timing

__all__ = [
    "Memory",
    "Parts",
    "assemble",
    "deps",
    "reactions",
    "start",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """What the allocator knows, built before any client exists (metrics read it too)."""

    policy: Policy
    ledger: Ledger
    pods: PodIndex
    published: PublishedClaims
    discovery: DiscoveryMirror[FleetView]
    instruments: Instruments
    registry: CollectorRegistry

    @classmethod
    def create(cls, settings: AllocatorSettings, registry: CollectorRegistry) -> Memory:
        ledger, pods = Ledger(), PodIndex()
        discovery = DiscoveryMirror(
            FleetView.build, topology_keys=settings.scheduling.topology_keys
        )
        return cls(
            policy=Policy.from_settings(settings),
            ledger=ledger,
            pods=pods,
            published=PublishedClaims(),
            discovery=discovery,
            instruments=Instruments(registry, ledger=ledger, pods=pods, discovery=discovery),
            registry=registry,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Parts:
    """Every part of a running allocator."""

    memory: Memory
    signals: Signals
    events: EventRecorder
    leader: Election
    judge: Judge
    refused: Refused
    nudger: Nudger
    reconciler: Reconciler
    sweeper: Sweeper
    admitter: Admitter
    committer: Committer
    queues: Reflector[Version]
    lost: LostServers
    booking: Booking
    lease_watch: Reflector[LeaseRecord]
    pod_watch: Reflector[PodInfo]
    server_policies: ServerPolicies | None
    """One NetworkPolicy per server (``RGPU_SERVER_POLICIES=on``); ``None`` when off."""


class _Collect(Collector):
    """A scrape-time collector around a part's own ``collect``."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


def reactions(p: Parts) -> dict[Signal, tuple[Callable[..., None], ...]]:
    """Which background activity hears which event: the allocator's whole wiring."""
    fences = () if p.server_policies is None else (p.server_policies,)
    return {
        Signal.CAPACITY_FREED: (p.nudger.notify, p.admitter.notify, *(f.notify for f in fences)),
        Signal.POD_CHANGED: (
            p.reconciler.pod_changed,
            p.nudger.pod_changed,
            p.admitter.pod_changed,
            p.lost.pod_changed,
            *(f.pod_changed for f in fences),
        ),
        Signal.CLAIMS_TOUCHED: (p.reconciler.enqueue,),
        Signal.LEADERSHIP: (
            p.reconciler.leadership,
            p.nudger.leadership,
            p.admitter.leadership,
            p.lost.leadership,
            *(f.leadership for f in fences),
        ),
        Signal.ADMISSION_LAPSED: (p.admitter.lapsed,),
    }


def assemble(
    settings: AllocatorSettings,
    memory: Memory,
    *,
    kube: KubeClient,
    probe_http: httpx.AsyncClient,
    clock: Callable[[], float],
    leader_lease: str,
    election: ElectionTiming,
    readiness: Readiness | None = None,
) -> Parts:
    """Build every part; nothing runs until ``start``. ``leader_lease`` names the Lease the
    replicas elect the one doing background work with, ``election`` its timing; the election
    holds ``readiness`` back while it keeps failing (no namespace, no rights)."""
    m, policy = memory, memory.policy
    signals, events = Signals(), EventRecorder(component=COMPONENT)
    m.discovery.on_fleet(wake_on_growth(signals.capacity_freed))
    api = KubeApi(
        kube, namespace=policy.namespace, lease_selector=MANAGED_BY_SELECTOR, events=events
    )
    leader = Election(
        kube,
        name=leader_lease,
        namespace=policy.namespace,
        timing=election,
        registry=m.registry,
        readiness=readiness,
    )
    leader.subscribe(signals.leadership)

    def leading() -> bool:
        return leader.is_leader

    timing = watch_timing(policy.ttl)
    pod_watch = pod_reflector(
        api, m.pods, signals.pod_changed, m.instruments, timing=timing, resources=settings.resources
    )
    trust = cache_trust(policy.ttl)
    judge = Judge(
        ledger=m.ledger,
        pods=m.pods,
        discovery=m.discovery,
        ttl=policy.ttl,
        clock=clock,
        pods_trusted=lambda: pod_watch.fresh(trust),
    )
    refused, waiting = Refused(), Waiting()
    nudger = Nudger(
        api,
        refused,
        clock=time.time,
        count=m.instruments.nudges.inc,
        waiting=waiting,
        leading=leading,
        held=lambda uid: bool(m.ledger.servers_of(uid)),
        nominees=lambda: m.ledger.nominees(time.time()),
    )
    writer = LeaseWriter(api, m.ledger, m.instruments, on_freed=signals.capacity_freed)
    remover = Remover(judge, writer, m.instruments, lapsed=signals.admission_lapsed)
    repairer = Repairer(policy, judge, writer, api, m.instruments, resources=settings.resources)
    reconciler = Reconciler(
        judge,
        writer,
        remover,
        repairer,
        refused,
        waiting=waiting,
        leading=leading,
        scheduler=policy.scheduler_name,
    )
    sweeper = Sweeper(judge, api, remover, reconciler, repairer, until_leading=leader.until_leading)
    hooks = LeaseHooks(freed=signals.capacity_freed, touched=signals.claims_touched)
    lease_watch = lease_reflector(
        api, m.ledger, hooks, m.instruments, timing=timing, published=m.published
    )
    booker = Booker(policy=policy, judge=judge, writer=writer)
    preemptor = Preemptor(
        policy=policy,
        judge=judge,
        writer=writer,
        api=api,
        instruments=m.instruments,
        nudge=signals.capacity_freed,
        remover=remover,
        enabled=settings.scheduling.preemption,
    )
    decider = Decider(policy=policy, instruments=m.instruments)
    planner = Planner(
        judge=judge,
        policy=policy,
        booker=booker,
        decider=decider,
        nominated_on=preemptor.nominated_on,
        admission_ttl=settings.admission.ttl_seconds,
    )
    queues = Queues(
        api=api,
        registry=m.registry,
        changed=signals.capacity_freed,
        namespace=policy.namespace,
    )
    admitter = Admitter(
        planner=planner,
        booker=booker,
        remover=remover,
        preemptor=preemptor,
        queues=queues,
        api=api,
        instruments=m.instruments,
        concurrency=settings.admission.concurrency,
        ahead=settings.admission.ahead,
        leading=leading,
    )
    m.registry.register(_Collect(admitter.collect))
    answers = Answers(policy=policy, judge=judge)
    booking = Booking(
        judge=judge,
        decider=decider,
        booker=booker,
        remover=remover,
        refusals=Refusals(preemptor=preemptor, refused=refused, instruments=m.instruments),
        checks=Checks(
            revalidator=Revalidator(judge, api, writer, remover),
            reprober=Reprober(DiscoveryClient(probe_http), m.instruments),
        ),
        answers=answers,
        api=api,
    )
    committer = Committer(
        policy=policy,
        judge=judge,
        writer=writer,
        finder=Finder(api, m.ledger),
        remover=remover,
        answers=answers,
    )
    return Parts(
        memory=m,
        signals=signals,
        events=events,
        leader=leader,
        judge=judge,
        refused=refused,
        nudger=nudger,
        reconciler=reconciler,
        sweeper=sweeper,
        admitter=admitter,
        queues=queues_reflector(api, queues),
        # Lost servers: the elected replica tells (and with evict, evicts) the holders of a
        # server unreachable or NotReady past the grace.
        lost=LostServers(
            api=KubeGates(kube, api),
            ledger=m.ledger,
            pods=m.pods,
            discovery=m.discovery,
            policy=LostPolicy.from_settings(settings),
            registry=m.registry,
            leading=leading,
        ),
        booking=booking,
        committer=committer,
        lease_watch=lease_watch,
        pod_watch=pod_watch,
        server_policies=_server_policies(settings, m, kube, leading),
    )


def _server_policies(
    settings: AllocatorSettings, m: Memory, kube: KubeClient, leading: Callable[[], bool]
) -> ServerPolicies | None:
    if not settings.server_policies.enabled:
        return None
    return ServerPolicies(
        lupine_api(kube, settings.server_policies),
        ledger=m.ledger,
        pods=m.pods,
        discovery=m.discovery,
        settings=settings.server_policies,
        system_namespace=m.policy.namespace,
        leading=leading,
        registry=m.registry,
    )


def deps(p: Parts) -> Deps:
    """What the HTTP handlers use."""
    m = p.memory
    return Deps(
        booking=p.booking,
        committer=p.committer,
        policy=m.policy,
        ledger=m.ledger,
        pods=m.pods,
        discovery=m.discovery,
        refused=p.refused,
        claims=m.published,
        admitter=p.admitter,
    )


async def start(tg: TaskGroup, p: Parts, *, kube: KubeClient, http: httpx.AsyncClient) -> None:
    """Start every background task, in the order readiness depends on."""
    await tg.start(p.events.run, kube)
    await tg.start(p.nudger.run)
    await tg.start(p.reconciler.run)
    await tg.start(p.lost.run)
    await tg.start(p.admitter.run)
    # Elected before the watches list, so a lone replica reconciles what they deliver; the
    # sweeper starts after them, so a leader's first sweep sees it all.
    await tg.start(p.leader.run)
    # Decisions wait for the first fleet themselves; starting must not.
    for follower in p.memory.discovery.followers(http):
        tg.start_soon(follower.run)
    await tg.start(p.lease_watch.run)
    # The queues are in before the pods: the first admission pass (it waits for the pods)
    # never runs on "no quota" by accident.
    await tg.start(p.queues.run)
    await tg.start(p.pod_watch.run)
    await tg.start(p.sweeper.run)
    if p.server_policies is not None:
        await tg.start(p.server_policies.run)
