"""Only a server's holders reach it, where the network can enforce that (``RGPU_SERVER_POLICIES``).

What each server's NetworkPolicy says is ``policy_objects``; this module keeps the policies
saying it. The policy of a server is a function of what every replica already mirrors — the
claim Leases (who holds the server), the pods (their addresses, reported by the kubelet after
the bind; a pod that finished has none) and the fleet (each server's node and port) — so
nothing about it is remembered anywhere else, and a restarted allocator rebuilds every policy
from claims the moment its caches are in.

The elected replica writes (``rgpu_runtime.replicas.Election``), like all the allocator's background
writes. Not the replica that commits a claim: the holder's address only exists after the
kubelet started the pod, which every replica learns from its pod watch, not from the commit;
one writer never has two replicas with caches a moment apart undo each other's policy; and the
writes do not grow with replicas. A handover delays policy changes by at most the leader
Lease (seconds): a new holder's first connections are refused meanwhile (lupine clients
retry), and a departed holder, already finished, has no address left to use.

Every change any cache reports (claims, pods, fleet, our own policies, lupine pods) wakes one
pass, and a pass runs every ``RECONCILE_SECONDS`` anyway: it computes every policy, writes
those that differ from what the apiserver holds (create, or replace with compare-and-swap),
deletes ours whose server left the fleet and holds nothing, and labels each lupine pod with
its node. Writes are idempotent: a pass with nothing to change writes nothing; one deleted or
edited by hand is put back by the next pass (its watch event wakes one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from rgpu_contracts import Server, ServerName
from rgpu_placement import FleetView
from rgpu_runtime.feeds import DiscoveryMirror
from rgpu_runtime.kube import ObjectChange, Reflector

from .claims import LeaseRecord, newer_or_equal
from .ledger import Ledger
from .lupine_pods import LupineApi, LupinePod, read_lupine_pod
from .pods import PodIndex, PodInfo
from .policy_objects import (
    Fence,
    Holder,
    PolicyRecord,
    node_label,
    policy_body,
    policy_name,
    read_policy,
)
from .policy_writes import PolicyMetrics, PolicyWriter, Write
from .settings import ServerPolicySettings

__all__ = ["RECONCILE_SECONDS", "ServerPolicies"]

RECONCILE_SECONDS: Final = 30.0
"""A pass at least this often, whatever was heard: a write lost with its watch event is put
back within this."""
SETTLE_SECONDS: Final = 0.05
"""Changes heard within this of the first are handled in one pass (a burst of bindings)."""
RETRY_SECONDS: Final = 1.0
"""After a failed write, the next pass comes this soon."""
WRITERS: Final = 8
"""Writes in flight at once (a first pass over thousands of servers)."""


class ServerPolicies:
    """The leader's keeper of one NetworkPolicy per server; run with ``await tg.start(run)``."""

    def __init__(
        self,
        api: LupineApi,
        *,
        ledger: Ledger,
        pods: PodIndex,
        discovery: DiscoveryMirror[FleetView],
        settings: ServerPolicySettings,
        system_namespace: str,
        leading: Callable[[], bool],
        registry: CollectorRegistry,
        period: float = RECONCILE_SECONDS,
    ) -> None:
        self._api = api
        self._ledger, self._pods, self._discovery = ledger, pods, discovery
        self._settings = settings
        self._system_namespace = system_namespace
        self._leading = leading
        self._period = period
        self._known: dict[str, PolicyRecord] = {}
        self._made: dict[str, dict[str, Any]] = {}
        self._dirty: set[str] = set()
        self._full = True
        self._seen: dict[ServerName, LeaseRecord] = {}
        self._view: object = None
        self._wake = anyio.Event()
        self._retry = False
        self._writer = PolicyWriter(api, written=self._remember, deleted=self._forget)
        self.policies = Reflector[PolicyRecord](
            name="networkpolicies",
            list_pages=api.policy_pages,
            watch=api.watch_policies,
            transform=read_policy,
            on_change=self._policy_changed,
        )
        self.lupine_pods = Reflector[LupinePod](
            name="lupine pods",
            list_pages=api.pod_pages,
            watch=api.watch_pods,
            transform=read_lupine_pod,
            on_change=self.notify,
        )
        self._metrics = PolicyMetrics(registry)

    # -- what wakes a pass ----------------------------------------------------------------

    def notify(self, *_: object) -> None:
        """Something a policy is made of changed: run a pass soon."""
        self._wake.set()

    def pod_changed(self, before: PodInfo | None, after: PodInfo | None) -> None:
        """A pod holding a claim got, changed or lost its addresses, or finished."""
        pod = after or before
        if pod is None or _admitted(before) == _admitted(after):
            return
        claims = self._ledger.claims_of(pod.uid)
        if claims:
            self._dirty.update(c.server for c in claims)
            self.notify()

    def leadership(self, leading: bool) -> None:
        if leading:
            self._full = True
            self.notify()

    def _policy_changed(self, change: ObjectChange[PolicyRecord]) -> None:
        if change.after is not None:
            self._remember(change.after)
            self._dirty.add(change.after.server)
        elif change.before is not None:
            known = self._known.get(change.before.name)
            if known is not None and newer_or_equal(
                change.resource_version, known.resource_version
            ):
                del self._known[change.before.name]
            self._dirty.add(change.before.server)
        self.notify()

    def _forget(self, name: str) -> None:
        self._known.pop(name, None)

    def _remember(self, record: PolicyRecord) -> None:
        known = self._known.get(record.name)
        if known is None or newer_or_equal(record.resource_version, known.resource_version):
            self._known[record.name] = record

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow our policies and the lupine pods, and keep them in line until cancelled."""
        async with anyio.create_task_group() as tg:
            # Not awaited: decisions never wait for the fence. A namespace or a grant missing
            # shows as the reflectors' warnings, and passes wait until both lists are in.
            tg.start_soon(self.policies.run)
            tg.start_soon(self.lupine_pods.run)
            tg.start_soon(self._follow_claims)
            task_status.started()
            while True:
                with anyio.move_on_after(RETRY_SECONDS if self._retry else self._period) as quiet:
                    await self._wake.wait()
                # A pass nothing asked for looks at every server: what a lost event missed.
                self._full = self._full or quiet.cancelled_caught
                await anyio.sleep(SETTLE_SECONDS)
                self._wake = anyio.Event()
                await self.reconcile()

    async def _follow_claims(self) -> None:
        revision = self._ledger.revision
        while True:
            revision = await self._ledger.wait_newer(revision, 3600.0)
            self.notify()

    def _ready(self) -> bool:
        return (
            self._leading()
            and self._ledger.synced
            and self._pods.synced
            and self._discovery.view is not None
            and self.policies.synced
            and self.lupine_pods.synced
        )

    async def reconcile(self) -> None:
        """One pass (the leader's, once every cache is in; else nothing)."""
        if not self._ready():
            if not self._leading():
                self._dirty.clear()  # the next leader starts with a full pass
            return
        failures: list[str | None] = []
        async with anyio.create_task_group() as tg:
            limiter = anyio.CapacityLimiter(WRITERS)
            for server, write in self._work():
                tg.start_soon(self._attempt, limiter, server, write, failures)
        self._retry = bool(failures)
        self._metrics.passed(len(failures))

    def _work(self) -> Iterable[tuple[str | None, Write]]:
        """Every write this pass needs, as (the server it is about, the write): the
        policies of the servers whose fence may have changed, ours of servers gone and free,
        lupine pods without their node label."""
        for server in self._changed():
            body = self._made.get(server)
            name = policy_name(server)
            known = self._known.get(name)
            if body is not None and (known is None or not known.says(body)):
                yield server, partial(self._writer.put, name, body, known)
        held = {r.server for r in self._seen.values() if r.claims}
        for name, known in tuple(self._known.items()):
            if known.server not in self._made and known.server not in held:
                yield known.server, partial(self._writer.delete, name)
        for pod in self.lupine_pods.values.values():
            wanted = node_label(pod.node)
            if pod.label != wanted:
                yield None, partial(self._writer.label, pod.name, wanted)

    async def _attempt(
        self,
        limiter: anyio.CapacityLimiter,
        server: str | None,
        write: Write,
        failures: list[str | None],
    ) -> None:
        async with limiter:
            if not self._leading():
                return
            action, outcome = await write()
            self._metrics.wrote(action, outcome)
            if not outcome:
                failures.append(server)
                # Looked at again next pass (a label is looked at on every pass anyway).
                if server is not None:
                    self._dirty.add(server)

    # -- what the policies say --------------------------------------------------------------

    def _changed(self) -> set[str]:
        """The servers whose policy may have changed since the last pass, each one's policy
        rebuilt (or dropped, for a server gone from the fleet). A Lease or a fleet that
        changed is a new object in the caches, so spotting them costs a pointer comparison
        per server; pods report their own changes (``pod_changed``)."""
        view = self._discovery.view
        servers = {s.name: s for s in view.fleet.servers} if view is not None else {}
        dirty, self._dirty = self._dirty, set()
        if self._full or view is not self._view:
            dirty.update(servers, self._made)
            self._full, self._view = False, view
        leases = {r.server: r for r in self._ledger.leases()}
        dirty.update(s for s, r in leases.items() if self._seen.get(s) is not r)
        dirty.update(self._seen.keys() - leases.keys())
        self._seen = leases
        for name in dirty:
            server = servers.get(ServerName(name))
            if server is None:
                self._made.pop(name, None)
            else:
                self._made[name] = self._body(self._fence(server))
        return dirty

    def _body(self, fence: Fence) -> dict[str, Any]:
        return policy_body(
            fence,
            namespace=self._settings.lupine_namespace,
            lupine_labels=self._settings.lupine_labels,
            system_namespace=self._system_namespace,
        )

    def _fence(self, server: Server) -> Fence:
        record = self._ledger.lease(server.name)
        holders = {}
        for claim in record.claims if record is not None else ():
            info = self._pods.get(claim.pod.uid)
            ips = _admitted(info)
            if info is not None and ips:
                holders[f"{info.namespace}/{info.name}"] = Holder(
                    pod=f"{info.namespace}/{info.name}", ips=ips
                )
        return Fence(
            server=server.name,
            node=server.node_name,
            port=server.port,
            holders=tuple(holders[k] for k in sorted(holders)),
        )


def _admitted(pod: PodInfo | None) -> tuple[str, ...]:
    """The addresses a holder is admitted from, while it runs (a finished pod's address goes
    back to the pool, and may soon be another pod's)."""
    if pod is None or pod.finished or not pod.bound:
        return ()
    return pod.ips
