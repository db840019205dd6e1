"""The allocator's parts built: each once, from the settings, what the allocator knows
(``memory``) and the clients the lifespan opened, then joined as the table of reactions in
``parts`` declares (which part hears which event).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import partial

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from rgpu_runtime.kube import EventRecorder, KubeClient
from rgpu_runtime.replicas import Election, ElectionTiming
from rgpu_runtime.serving import Readiness

from .admitting import Admitter
from .answers import Answers
from .booker import Booker, Pending
from .booking import Booking
from .claims import MANAGED_BY_SELECTOR
from .clients import COMPONENT, DiscoveryClient, KubeApi
from .committing import Committer
from .deciding import Decider
from .growth import wake_on_growth
from .judging import Judge
from .leases import Finder, LeaseWriter
from .lost import LostServers
from .lupine_pods import lupine_api
from .memory import Memory
from .nudging import Nudger
from .parts import Clients, Parts, reactions
from .planning import Planner
from .policy import LostPolicy
from .preempting import Preemptor
from .queues import Queues, queues_reflector
from .reactions import Signals
from .readiness import KubeGates
from .refusing import Checks, Refusals
from .removal import Remover
from .repair import Repairer
from .revalidation import Reprober, Revalidator
from .server_policies import ServerPolicies
from .settings import AllocatorSettings
from .sweeping import Reconciler, Sweeper
from .waiters import Refused, Waiting
from .watching import LeaseHooks, cache_trust, lease_reflector, pod_reflector, watch_timing

__all__ = ["assemble"]


class _Collect(Collector):
    """A scrape-time collector around a part's own ``collect``."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


def assemble(
    settings: AllocatorSettings,
    memory: Memory,
    clients: Clients,
    *,
    clock: Callable[[], float],
    leader: tuple[str, ElectionTiming],
    readiness: Readiness | None = None,
) -> Parts:
    """Build every part and connect them as ``reactions`` declares; nothing runs until
    ``start``. ``leader`` names the Lease the replicas elect the one doing background work
    with, and its timing; the election holds ``readiness`` back while it keeps failing (no
    namespace, no rights)."""
    m, policy = memory, memory.policy
    kube, probe_http = clients.kube, clients.probe_http
    signals, events = Signals(), EventRecorder(component=COMPONENT)
    m.discovery.on_fleet(wake_on_growth(signals.capacity_freed))
    api = KubeApi(
        kube, namespace=policy.namespace, lease_selector=MANAGED_BY_SELECTOR, events=events
    )
    leader_lease, election = leader
    elected = Election(
        kube,
        name=leader_lease,
        namespace=policy.namespace,
        timing=election,
        registry=m.registry,
        readiness=readiness,
    )
    elected.subscribe(signals.leadership)

    def leading() -> bool:
        return elected.is_leader

    timing = watch_timing(policy.ttl)
    pod_watch = pod_reflector(
        api, m.pods, signals.pod_changed, m.instruments, timing=timing, resources=settings.resources
    )
    trust = cache_trust(policy.ttl)
    pending = Pending()
    judge = Judge(
        ledger=m.ledger,
        pods=m.pods,
        discovery=m.discovery,
        ttl=policy.ttl,
        clock=clock,
        pods_trusted=partial(pod_watch.fresh, trust),
        pending=pending.by_server,
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
    sweeper = Sweeper(
        judge, api, remover, reconciler, repairer, until_leading=elected.until_leading
    )
    hooks = LeaseHooks(freed=signals.capacity_freed, touched=signals.claims_touched)
    lease_watch = lease_reflector(
        api, m.ledger, hooks, m.instruments, timing=timing, published=m.published
    )
    booker = Booker(policy=policy, judge=judge, writer=writer, pending=pending)
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
        nominated_on=preemptor.nominations.nominated_on,
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
    parts = Parts(
        memory=m,
        signals=signals,
        events=events,
        leader=elected,
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
    signals.connect(reactions(parts))
    return parts


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
