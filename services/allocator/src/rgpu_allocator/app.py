"""The composition root. It builds the allocator's state and
activities from the settings, and its lifespan owns every client (apiserver, discovery) and
every background task (fleet and topology long-polls, pod and Lease watches, reconciler,
sweeper, nudger, the leader election) in one task group; ``/readyz`` turns ready once all of
them have started, which for the watches means their first list is in.

Decisions are active-active on every replica. The work a replica does on its own initiative —
reconciling, sweeping, repairing and nudging, all apiserver writes — runs only on the replica
holding the ``rgpu-allocator-leader`` Lease, so those writes do not grow with the replica
count; a follower is just as ready (it decides as well as the leader does).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from rgpu_runtime import (
    DISCOVERY_AUDIENCE,
    Election,
    ElectionTiming,
    EventRecorder,
    Readiness,
    Settings,
    bearer_auth,
    caller_auth,
    create_service_app,
    http_client,
    kube_client,
)

from .booking import Booking
from .claims import MANAGED_BY_SELECTOR, Ledger
from .clients import COMPONENT, DiscoveryClient, KubeApi
from .inputs import Inputs, follow_fleet, follow_topology
from .instruments import Instruments
from .judging import Judge, Policy, Remover
from .leases import Finder, LeaseWriter
from .pods import PodIndex, PodInfo
from .preempting import Preemptor
from .published import PublishedClaims
from .rechecking import Reprober, Revalidator
from .repair import Repairer
from .routes import ROUTES, Deps, State
from .sweeping import Reconciler, Sweeper
from .wakeup import Nudger, Refused, Waiting
from .watching import LeaseHooks, cache_trust, lease_reflector, pod_reflector, watch_timing

__all__ = ["create_app"]

DISCOVERY_TIMEOUT = 5.0
"""Seconds for an ordinary discovery call; long-polls add their hold time on top."""
LEADER_LEASE = "rgpu-allocator-leader"
"""The Lease whose holder does the background work (in the system namespace, unlabelled, so
the claim reflector never lists it)."""
LEADER_TIMING = ElectionTiming(lease_seconds=4, renew_deadline_seconds=3, retry_seconds=1)
"""Shorter than client-go's 15 s lease: while no replica leads nobody nudges parked pods, so a
killed leader's successor should take over within seconds (one renewal a second in all)."""


def create_app(
    settings: Settings,
    *,
    discovery_transport: httpx.AsyncBaseTransport | None = None,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
    election: ElectionTiming | None = None,
) -> Starlette:
    """Build the allocator app; ``discovery_transport`` replaces the network, ``clock``
    the wall clock claims are stamped and judged with, and ``election`` the leader lease's
    timing (tests)."""
    registry = CollectorRegistry() if registry is None else registry
    readiness = Readiness()
    policy = Policy.from_settings(settings)
    ledger, pods, published = Ledger(), PodIndex(), PublishedClaims()
    inputs = Inputs(settings.scheduling.topology_keys)
    instruments = Instruments(registry, ledger=ledger, pods=pods, inputs=inputs)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        async with (
            kube_client(settings) as kube,
            http_client(
                base_url=settings.peers.discovery_url,
                timeout=DISCOVERY_TIMEOUT,
                transport=discovery_transport,
            ) as http,
            http_client(
                base_url=settings.peers.discovery_url,
                timeout=DISCOVERY_TIMEOUT,
                transport=discovery_transport,
            ) as probe_http,
        ):
            # Discovery's probe answers only confirmed callers, so probes carry this service's
            # token; the fleet and topology long-polls are open reads and never wait for one.
            token = bearer_auth(settings, kube, audience=DISCOVERY_AUDIENCE)
            if token is not None:
                probe_http.auth = token
            auth = caller_auth(settings, kube, routes=("allocation",))
            events = EventRecorder(component=COMPONENT)
            api = KubeApi(
                kube, namespace=policy.namespace, lease_selector=MANAGED_BY_SELECTOR, events=events
            )
            refused, waiting = Refused(), Waiting()
            leader = Election(
                kube,
                name=LEADER_LEASE,
                namespace=policy.namespace,
                timing=LEADER_TIMING if election is None else election,
                registry=registry,
            )

            def leading() -> bool:
                return leader.is_leader

            nudger = Nudger(
                api,
                refused,
                clock=time.time,
                count=instruments.nudges.inc,
                waiting=waiting,
                leading=leading,
                held=lambda uid: bool(ledger.servers_of(uid)),
                nominees=lambda: ledger.nominees(time.time()),
            )
            trust = cache_trust(policy.ttl)

            def pods_trusted() -> bool:
                # The pod watch feeds the reconciler, which judges: the cycle closes here,
                # and ``pod_watch`` is built below before anything can call this.
                return pod_watch.fresh(trust)

            judge = Judge(
                ledger=ledger,
                pods=pods,
                inputs=inputs,
                ttl=policy.ttl,
                clock=clock,
                pods_trusted=pods_trusted,
            )
            writer = LeaseWriter(api, ledger, instruments, on_freed=nudger.notify)
            remover = Remover(judge, writer, instruments)
            repairer = Repairer(
                policy, judge, writer, api, instruments, resources=settings.resources
            )
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
            leader.subscribe(reconciler.leadership)
            leader.subscribe(nudger.leadership)
            sweeper = Sweeper(
                judge, api, remover, reconciler, repairer, until_leading=leader.until_leading
            )
            lease_hooks = LeaseHooks(freed=nudger.notify, touched=reconciler.enqueue)
            timing = watch_timing(policy.ttl)
            lease_watch = lease_reflector(
                api, ledger, lease_hooks, instruments, timing=timing, published=published
            )

            def pod_changed(before: PodInfo | None, after: PodInfo | None) -> None:
                reconciler.pod_changed(before, after)
                nudger.pod_changed(before, after)

            pod_watch = pod_reflector(api, pods, pod_changed, instruments, timing=timing)
            async with anyio.create_task_group() as tg:
                await tg.start(events.run, kube)
                await tg.start(nudger.run)
                await tg.start(reconciler.run)
                # Elected before the watches list, so a lone replica reconciles what they
                # deliver; the sweeper starts after them, so a leader's first sweep sees it all.
                await tg.start(leader.run)
                # Decisions wait for the first fleet themselves; starting must not.
                tg.start_soon(follow_fleet(http, inputs, nudger.notify).run)
                tg.start_soon(follow_topology(http, inputs).run)
                await tg.start(lease_watch.run)
                await tg.start(pod_watch.run)
                await tg.start(sweeper.run)
                readiness.set_ready()
                booking = Booking(
                    policy=policy,
                    judge=judge,
                    writer=writer,
                    remover=remover,
                    finder=Finder(api, ledger),
                    revalidator=Revalidator(judge, api, writer, remover),
                    reprober=Reprober(DiscoveryClient(probe_http), instruments),
                    refused=refused,
                    instruments=instruments,
                    preemptor=Preemptor(
                        policy=policy,
                        judge=judge,
                        writer=writer,
                        api=api,
                        instruments=instruments,
                        nudge=nudger.notify,
                        enabled=settings.scheduling.preemption,
                    ),
                )
                deps = Deps(
                    booking=booking,
                    policy=policy,
                    ledger=ledger,
                    pods=pods,
                    inputs=inputs,
                    refused=refused,
                    claims=published,
                )
                yield {"deps": deps, "caller_auth": auth}
                tg.cancel_scope.cancel()

    return create_service_app(
        service="allocator",
        routes=ROUTES,
        lifespan=lifespan,
        readiness=readiness,
        registry=registry,
        max_body_bytes=settings.http.max_body_bytes,
    )
