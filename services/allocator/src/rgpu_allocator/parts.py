"""Every part of a running allocator (``Parts``), and how they are joined once built: which
part hears which event (``reactions``, the allocator's whole background wiring in one table),
what the HTTP handlers use (``deps``), and the order the background tasks start in
(``start``), which is the order their readiness depends on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
from anyio.abc import TaskGroup

from rgpu_runtime.kube import EventRecorder, KubeClient, Reflector
from rgpu_runtime.replicas import Election

from .admitting import Admitter
from .booking import Booking
from .claims import LeaseRecord
from .committing import Committer
from .judging import Judge
from .lost import LostServers
from .memory import Memory
from .nudging import Nudger
from .pods import PodInfo
from .queues import Version
from .reactions import Signal, Signals
from .routes import Deps
from .server_policies import ServerPolicies
from .sweeping import Reconciler, Sweeper
from .waiters import Refused

__all__ = ["Clients", "Parts", "deps", "reactions", "start"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Clients:
    """The clients the lifespan opened: the apiserver's, and discovery's for long-polls and
    for probes (which carry this service's token)."""

    kube: KubeClient
    http: httpx.AsyncClient
    probe_http: httpx.AsyncClient


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


async def start(tg: TaskGroup, p: Parts, clients: Clients) -> None:
    """Start every background task, in the order readiness depends on."""
    kube, http = clients.kube, clients.http
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
