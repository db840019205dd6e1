"""The composition root. It builds the allocator's state and
activities from the settings, and its lifespan owns every client (apiserver, discovery) and
every background task (fleet and topology long-polls, pod and Lease watches, reconciler,
sweeper, nudger) in one task group; ``/readyz`` turns ready once all of them have started,
which for the watches means their first list is in.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import anyio
import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from rgpu_runtime import (
    EventRecorder,
    Readiness,
    Settings,
    create_service_app,
    http_client,
    kube_client,
)

from .committing import Finder
from .core import Core, Policy
from .discovery_client import DiscoveryClient
from .events import COMPONENT
from .inputs import Inputs, follow_fleet, follow_topology
from .instruments import Instruments
from .kube_api import KubeApi
from .leases import MANAGED_BY_SELECTOR
from .ledger import Ledger
from .pods import PodIndex
from .reconciling import Reconciler
from .repairing import Repairer
from .reprobing import Reprober
from .revalidating import Revalidator
from .routes import ROUTES, Deps, State
from .service import AllocatorService
from .sweeping import Sweeper
from .wakeup import Nudger, Refused
from .watching import LeaseHooks, watch_leases, watch_pods, watch_timing
from .writing import LeaseWriter

__all__ = ["create_app"]

DISCOVERY_TIMEOUT = 5.0
"""Seconds for an ordinary discovery call; long-polls add their hold time on top."""


def create_app(
    settings: Settings,
    *,
    discovery_transport: httpx.AsyncBaseTransport | None = None,
    registry: CollectorRegistry | None = None,
) -> Starlette:
    """Build the allocator app; ``discovery_transport`` replaces the network (tests)."""
    registry = CollectorRegistry() if registry is None else registry
    readiness = Readiness()
    policy = Policy.from_settings(settings)
    ledger, pods = Ledger(), PodIndex()
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
        ):
            events = EventRecorder(component=COMPONENT)
            api = KubeApi(
                kube, namespace=policy.namespace, lease_selector=MANAGED_BY_SELECTOR, events=events
            )
            refused = Refused()
            nudger = Nudger(api, refused, clock=time.time, count=instruments.nudges.inc)
            core = Core(
                policy=policy,
                ledger=ledger,
                pods=pods,
                inputs=inputs,
                api=api,
                writer=LeaseWriter(api, ledger, instruments, on_freed=nudger.notify),
                instruments=instruments,
                refused=refused,
                on_capacity=nudger.notify,
            )
            repairer = Repairer(core)
            reconciler = Reconciler(core, repairer)
            discovery = DiscoveryClient(http)
            lease_hooks = LeaseHooks(freed=nudger.notify, touched=reconciler.enqueue)
            async with anyio.create_task_group() as tg:
                await tg.start(events.run, kube)
                await tg.start(nudger.run)
                await tg.start(reconciler.run)
                # Decisions wait for the first fleet themselves; starting must not.
                tg.start_soon(follow_fleet(http, inputs, nudger.notify).run)
                tg.start_soon(follow_topology(http, inputs).run)
                timing = watch_timing(policy.ttl)
                await tg.start(
                    partial(watch_leases, timing=timing), api, ledger, lease_hooks, instruments
                )
                await tg.start(
                    partial(watch_pods, timing=timing),
                    api,
                    pods,
                    reconciler.pod_changed,
                    instruments,
                )
                await tg.start(Sweeper(core, reconciler, repairer).run)
                readiness.set_ready()
                service = AllocatorService(
                    core=core,
                    revalidator=Revalidator(core),
                    reprober=Reprober(discovery, instruments),
                    finder=Finder(core),
                )
                yield {"deps": Deps(service=service)}
                tg.cancel_scope.cancel()

    return create_service_app(
        service="allocator",
        routes=ROUTES,
        lifespan=lifespan,
        readiness=readiness,
        registry=registry,
    )
