"""When a held server stops answering lupine's probe or its Node turns NotReady, the holder's
CUDA calls hang and nothing in Kubernetes knows: the pod stays Running and Ready, its Service
keeps sending it work, its owner sees nothing. This watch, run by the elected replica, tells
them once the server has been lost for the grace (``RGPU_SERVER_LOST_GRACE_SECONDS``):

* a Warning Event ``RemoteGPUServerLost`` on each holder (and a Normal
  ``RemoteGPUServerBack`` when the server returns);
* for a holder that declares the readiness gate ``rgpu.io/remote-gpu-ready``, that condition
  False (Kubernetes then counts the pod not Ready), and True again when the server is back; a
  gated holder on a healthy server gets it True as soon as it runs;
* with ``RGPU_ON_SERVER_LOST=evict``, an eviction through the Eviction API, so the pod's
  controller runs it elsewhere (a PodDisruptionBudget's ``429`` is retried with backoff);
* ``rgpu_holders_lost{server}``: holders of each server lost past the grace.

A holder is a pod placed on a node with a claim on the server. A held server the fleet no
longer lists (its Node deleted — a cloud's node controller does that to a terminated
instance — or its lupine label removed) is lost too: its holders' CUDA calls hang just the
same. The grace runs from when this replica first saw the loss: a new leader starts it again,
so a handover can lengthen it, never shorten it, and may repeat an Event once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry, Counter, Gauge

from rgpu_contracts import Claim, PodUID, Server, ServerName
from rgpu_placement import FleetView
from rgpu_runtime.errors import KubeError
from rgpu_runtime.feeds import DiscoveryMirror

from .clients import pod_event
from .errors import EvictionRefused
from .ledger import Ledger
from .losses import Loss, Losses
from .pods import PodIndex, PodInfo
from .policy import LostPolicy
from .readiness import GateApi

__all__ = ["REASON_BACK", "REASON_EVICTED", "REASON_LOST", "LostServers"]

logger = logging.getLogger(__name__)

REASON_LOST: Final = "RemoteGPUServerLost"
REASON_BACK: Final = "RemoteGPUServerBack"
REASON_EVICTED: Final = "RemoteGPUServerLostEvicted"
POLL_SECONDS: Final = 1.0
"""How often the watch looks whether the fleet, the claims or a deadline moved; a look that
finds nothing new costs a few comparisons."""
PASS_SECONDS: Final = 0.25
"""The least time between two looks: a look reads every claim, and a burst of pod changes (a
job of gated pods starting) must cost a few looks a second, not one per change."""
REWRITE_SECONDS: Final = 2.0
"""A condition written but not yet seen back in the pod cache is written again after this:
the watch may lag, or a kubelet status write may have replaced it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Retry:
    at: float
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _Holder:
    claim: Claim
    pod: PodInfo
    server: ServerName
    endpoint: str
    """Where the server answered, as the fleet lists it (empty once it is not listed)."""


class LostServers:
    """Watches held servers and acts on lost ones while ``leading()``; ``run`` must run."""

    def __init__(
        self,
        *,
        api: GateApi,
        ledger: Ledger,
        pods: PodIndex,
        discovery: DiscoveryMirror[FleetView],
        policy: LostPolicy,
        registry: CollectorRegistry,
        leading: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._ledger = ledger
        self._pods = pods
        self._discovery = discovery
        self._policy = policy
        self._leading = leading
        self._clock = clock
        self._losses = Losses()
        self._told: dict[PodUID, ServerName] = {}
        self._written: dict[PodUID, tuple[bool, float]] = {}
        self._retries: dict[PodUID, _Retry] = {}
        self._evicted: set[PodUID] = set()
        self._seen: tuple[object, int] = (None, -1)
        self._wake = anyio.Event()
        self._lost_gauge = Gauge(
            "rgpu_holders_lost",
            "Pods holding a remote GPU server that has been unreachable or NotReady past the "
            "grace (exported by the elected allocator replica).",
            ("server",),
            registry=registry,
        )
        self._evictions = Counter(
            "rgpu_allocator_lost_server_evictions_total",
            "Evictions of holders of lost servers (RGPU_ON_SERVER_LOST=evict) by outcome.",
            ("outcome",),
            registry=registry,
        )
        for outcome in ("evicted", "refused", "error"):
            self._evictions.labels(outcome)

    def notify(self) -> None:
        """Look again now (a pod, the fleet or the leadership changed)."""
        self._wake.set()

    def pod_changed(self, before: PodInfo | None, after: PodInfo | None) -> None:
        """A pod changed in the cache: gated pods and told holders are worth a look."""
        pods = (p for p in (before, after) if p is not None)
        if any(p.ready_gate or p.uid in self._told for p in pods):
            self.notify()

    def leadership(self, leading: bool) -> None:
        """Leading started or stopped (``Election.subscribe``)."""
        self.notify()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled."""
        task_status.started()
        while True:
            with anyio.move_on_after(POLL_SECONDS):
                await self._wake.wait()
            woken, self._wake = self._wake.is_set(), anyio.Event()
            if woken or self._moved():
                await self.reconcile()
                await anyio.sleep(PASS_SECONDS)

    def _moved(self) -> bool:
        view, revision = self._seen
        if self._discovery.view is not view or self._ledger.revision != revision:
            return True
        return min(self._deadlines(), default=math.inf) <= self._clock()

    def _deadlines(self) -> Iterable[float]:
        grace = self._policy.grace
        yield from self._losses.deadlines(grace)
        yield from (retry.at for retry in self._retries.values())
        yield from (at + REWRITE_SECONDS for _, at in self._written.values())

    async def reconcile(self) -> None:
        """One look at every holder; acts only while leading."""
        if not self._leading():
            self._stand_down()
            return
        view = self._discovery.view
        if view is None or not (self._ledger.synced and self._pods.synced):
            return
        self._seen = (view, self._ledger.revision)
        now = self._clock()
        servers = {s.name: s for s in view.fleet.servers}
        self._losses.track(servers, self._held_servers(), now)
        holders = list(self._holders(servers))
        self._export(holders, now)
        for holder in holders:
            await self._judge(holder, now)
        self._forget(holders)

    def _held_servers(self) -> set[ServerName]:
        return {r.server for r in self._ledger.leases() if r.claims}

    def _holders(self, servers: dict[ServerName, Server]) -> Iterable[_Holder]:
        for record in self._ledger.leases():
            server = servers.get(record.server)
            endpoint = (server.endpoint if server is not None else None) or ""
            for claim in record.claims:
                pod = self._pods.get(claim.pod.uid)
                if pod is not None and pod.bound and not pod.finished:
                    yield _Holder(claim=claim, pod=pod, server=record.server, endpoint=endpoint)

    def _export(self, holders: list[_Holder], now: float) -> None:
        counts: dict[ServerName, int] = {}
        for holder in holders:
            if self._losses.past(holder.server, now, self._policy.grace) is not None:
                counts[holder.server] = counts.get(holder.server, 0) + 1
        self._lost_gauge.clear()
        for server, count in counts.items():
            self._lost_gauge.labels(server).set(count)

    async def _judge(self, holder: _Holder, now: float) -> None:
        name = holder.server
        loss = self._losses.past(name, now, self._policy.grace)
        if loss is not None:
            await self._lost(holder, loss, now)
        elif not self._losses.lost(name):
            await self._fine(holder, now)

    async def _lost(self, holder: _Holder, loss: Loss, now: float) -> None:
        pod, server = holder.pod, holder.server
        lasted = now - loss.since
        message = (
            f"remote GPU server {server} ({holder.endpoint or 'no endpoint'}) lost for "
            f"{lasted:.0f}s: {loss.why}; CUDA calls to it hang until it returns"
        )
        if self._told.get(pod.uid) != server:
            self._told[pod.uid] = server
            self._api.record_event(pod_event(pod.ref, reason=REASON_LOST, message=message))
        await self._gate(pod, False, REASON_LOST, message, now)
        if self._policy.evict:
            await self._evict(pod, server, now)

    async def _fine(self, holder: _Holder, now: float) -> None:
        pod, server = holder.pod, holder.server
        if self._told.pop(pod.uid, None) == server:
            message = f"remote GPU server {server} answers again"
            self._api.record_event(
                pod_event(pod.ref, reason=REASON_BACK, message=message, warning=False)
            )
        await self._gate(pod, True, "RemoteGPUServerReady", f"server {server} is reachable", now)

    async def _gate(self, pod: PodInfo, ready: bool, reason: str, message: str, now: float) -> None:
        if not pod.ready_gate or pod.ready_gate_status == ("True" if ready else "False"):
            self._written.pop(pod.uid, None)
            return
        written = self._written.get(pod.uid)
        if written is not None and written[0] == ready and now - written[1] < REWRITE_SECONDS:
            return
        self._written[pod.uid] = (ready, now)
        try:
            await self._api.set_gate(pod.ref, ready, reason, message)
        except KubeError as exc:
            logger.warning("readiness gate of %s not written, will retry: %s", pod.ref.key, exc)

    async def _evict(self, pod: PodInfo, server: ServerName, now: float) -> None:
        retry = self._retries.get(pod.uid)
        if pod.deleting or pod.uid in self._evicted or (retry is not None and now < retry.at):
            return
        try:
            await self._api.evict(pod.ref)
        except EvictionRefused as exc:
            self._again(pod, retry, now, "refused", exc.message)
            return
        except KubeError as exc:
            self._again(pod, retry, now, "error", exc.message)
            return
        self._evicted.add(pod.uid)
        self._retries.pop(pod.uid, None)
        self._evictions.labels("evicted").inc()
        logger.info("evicted %s: its remote GPU server %s is lost", pod.ref.key, server)
        message = f"evicted: remote GPU server {server} is lost (RGPU_ON_SERVER_LOST=evict)"
        self._api.record_event(pod_event(pod.ref, reason=REASON_EVICTED, message=message))

    def _again(
        self, pod: PodInfo, retry: _Retry | None, now: float, outcome: str, why: str
    ) -> None:
        attempt = 0 if retry is None else retry.attempt + 1
        delay = self._policy.retry.delay(attempt)
        self._retries[pod.uid] = _Retry(at=now + delay, attempt=attempt)
        self._evictions.labels(outcome).inc()
        logger.info("eviction of %s %s, retrying in %.1fs: %s", pod.ref.key, outcome, delay, why)

    def _forget(self, holders: list[_Holder]) -> None:
        """Drop what is remembered about pods that hold nothing any more."""
        current = {holder.pod.uid for holder in holders}
        for table in (self._told, self._written, self._retries):
            for uid in [uid for uid in table if uid not in current]:
                del table[uid]
        self._evicted &= current

    def _stand_down(self) -> None:
        """Not leading: act on nothing and export nothing; a new term starts afresh."""
        if self._losses or self._told or self._written or self._retries or self._evicted:
            self._losses.clear()
            self._told.clear()
            self._written.clear()
            self._retries.clear()
            self._evicted.clear()
        self._lost_gauge.clear()
        self._seen = (None, -1)
