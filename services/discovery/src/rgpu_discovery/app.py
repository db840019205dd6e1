"""The composition root — it builds discovery's states, opens its
clients (apiserver, lupine probes), starts its background tasks (membership, probe-state
watch and writer, Node watch, shared probes, probe loop, event outbox) in one task group the
lifespan owns, and hands the states to the routes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from rgpu_runtime.kube import kube_client
from rgpu_runtime.pacing import Backoff
from rgpu_runtime.peers import caller_auth
from rgpu_runtime.replicas import Membership, MembershipTiming
from rgpu_runtime.serving import Readiness, create_service_app

from .clients import StateLeaseApi, event_recorder, node_event
from .fleet import FleetState
from .instruments import Instruments
from .lupine import Dialer, LupineProber, dial_tcp
from .lupine_version import VersionAnswer, ask_cuda_version
from .nodes import NodeNotices
from .probe_states import COMPONENT_SELECTOR
from .probing import REPROBE_MIN_INTERVAL, ProbeFlights, ProbeLoop, Reprober
from .routes import ROUTES, Deps, State
from .settings import DiscoverySettings
from .sharding import GROUP, Shard
from .state_watch import StateWatch
from .state_writer import HEARTBEAT_SECONDS, StateWriter, WriterPolicy
from .topology import TopologyState
from .versions import Versions
from .watching import Catalog, NodeWatch

__all__ = ["WATCH_BACKOFF", "create_app"]

WATCH_BACKOFF = Backoff(initial=0.2, maximum=10.0)
"""Retry policy after an apiserver failure: quick for a blip, at most 10 s for an outage."""


def create_app(
    settings: DiscoverySettings,
    *,
    probe_dialer: Dialer = dial_tcp,
    registry: CollectorRegistry | None = None,
    watch_backoff: Backoff = WATCH_BACKOFF,
    reprobe_min_interval: float = REPROBE_MIN_INTERVAL,
    identity: str | None = None,
    membership: MembershipTiming | None = None,
    writer_policy: WriterPolicy | None = None,
) -> Starlette:
    """Discovery's ASGI app; ``probe_dialer`` opens the lupine probes' connections.

    ``reprobe_min_interval`` (seconds): an on-demand probe of a server probed more recently
    than this answers with the current state instead of probing. Raises ``ValueError`` when
    it is negative. ``identity`` names this replica among its peers (default: the host
    name, which in a pod is the pod's name, and the process id, which tells apart replicas
    sharing a host); ``membership`` and ``writer_policy`` time the
    sharing of probes (``sharding``, ``state_writer``).
    """
    registry = CollectorRegistry() if registry is None else registry
    readiness = Readiness()
    fleet = FleetState(default_port=settings.lupine.default_port)
    topology = TopologyState()
    instruments = Instruments.create(registry, fleet, topology)
    timeout = settings.lupine.probe_timeout_seconds
    name = identity or f"{socket.gethostname()}-{os.getpid()}"
    interval = settings.lupine.probe_interval_seconds
    policy = writer_policy or WriterPolicy(heartbeat_seconds=max(HEARTBEAT_SECONDS, 4 * interval))
    if not reprobe_min_interval >= 0:
        raise ValueError(f"reprobe_min_interval must be >= 0 seconds, got {reprobe_min_interval!r}")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        events = event_recorder(instruments.events)
        notices = NodeNotices(
            default_port=settings.lupine.default_port,
            emit=lambda event: events.record(node_event(event)),
        )
        catalog = Catalog(
            fleet=fleet,
            topology=topology,
            notices=notices,
            topology_keys=settings.scheduling.topology_keys,
        )
        async with (
            kube_client(settings) as kube,
            LupineProber(timeout=timeout, dialer=probe_dialer) as prober,
            anyio.create_task_group() as tg,
        ):
            watch = NodeWatch(
                kube=kube,
                catalog=catalog,
                readiness=readiness,
                instruments=instruments,
                backoff=watch_backoff,
            )
            states = StateLeaseApi(kube, settings.scheduling.namespace, COMPONENT_SELECTOR)
            state_watch = StateWatch(api=states, fleet=fleet, backoff=watch_backoff)
            shard = Shard(
                membership=Membership(
                    kube=kube,
                    namespace=settings.scheduling.namespace,
                    group=GROUP,
                    identity=name,
                    timing=membership,
                    readiness=readiness,
                ),
                fleet=fleet,
                instruments=instruments,
                readiness=readiness,
                patience=(membership or MembershipTiming()).lease_seconds,
            )
            writer = StateWriter(
                api=states,
                fleet=fleet,
                watch=state_watch,
                instruments=instruments,
                identity=name,
                policy=policy,
                owns=shard.owns,
            )

            async def ask(endpoint: str) -> VersionAnswer:
                return await ask_cuda_version(endpoint, dialer=probe_dialer, timeout=timeout)

            versions = Versions(
                fleet=fleet, ask=ask, count=lambda r: instruments.version_queries.labels(r).inc()
            )
            flights = ProbeFlights(
                record=writer.record, prober=prober, instruments=instruments, versions=versions
            )
            probes = ProbeLoop(
                fleet=fleet,
                flights=flights,
                interval=settings.lupine.probe_interval_seconds,
                owns=shard.owns,
                settled=shard.settled,
            )
            reprober = Reprober(
                fleet=fleet,
                flights=flights,
                instruments=instruments,
                min_interval=reprobe_min_interval,
            )
            await tg.start(events.run, kube)
            instruments.stale.set_function(writer.stale_states)
            await tg.start(shard.run)
            await tg.start(flights.run)
            await tg.start(writer.run)
            await tg.start(_follow, state_watch, watch)
            await tg.start(probes.run)
            yield {
                "deps": Deps(fleet=fleet, topology=topology, reprober=reprober),
                "caller_auth": caller_auth(settings, kube, routes=("probe",)),
            }
            tg.cancel_scope.cancel()

    return create_service_app(
        service="discovery",
        routes=ROUTES,
        lifespan=lifespan,
        readiness=readiness,
        registry=registry,
    )


async def _follow(
    states: StateWatch,
    nodes: NodeWatch,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Follow the probe states, then the Nodes: the first fleet published (and readiness)
    then already carries what the other replicas probed, instead of a fleet that looks
    never-probed for a moment."""
    task_status.started()
    async with anyio.create_task_group() as tg:
        await tg.start(states.run)
        await tg.start(nodes.run)
