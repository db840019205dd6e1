"""Only a server's holders reach it, where the network can enforce that (``RGPU_SERVER_POLICIES``).

What each server's NetworkPolicy says is ``policy_objects``; this module keeps the policies
saying it. The policy of a server is a function of what every replica already mirrors — the
claim Leases (who holds the server), the pods (their addresses, reported by the kubelet after
the bind; a pod that finished has none) and the fleet (each server's node and port) — so
nothing about it is remembered anywhere else, and a restarted allocator rebuilds every policy
from claims the moment its caches are in.

The elected replica writes (``rgpu_runtime.Election``), like all the allocator's background
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

import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry, Counter, Gauge

from rgpu_contracts import Server
from rgpu_runtime import (
    KubeClient,
    KubeConflict,
    KubeError,
    KubeNotFound,
    ObjectChange,
    Reflector,
    ServerPolicySettings,
)

from .claims import MANAGED_BY_SELECTOR, newer_or_equal
from .clients import LupineApi
from .inputs import Inputs
from .ledger import Ledger
from .pods import PodIndex, PodInfo
from .policy_objects import (
    NODE_LABEL,
    Fence,
    Holder,
    PolicyRecord,
    node_label,
    policy_body,
    read_policy,
)

__all__ = ["RECONCILE_SECONDS", "LupinePod", "ServerPolicies", "lupine_api"]

logger = logging.getLogger(__name__)

RECONCILE_SECONDS: Final = 30.0
"""A pass at least this often, whatever was heard: a write lost with its watch event is put
back within this."""
SETTLE_SECONDS: Final = 0.05
"""Changes heard within this of the first are handled in one pass (a burst of bindings)."""
RETRY_SECONDS: Final = 1.0
"""After a failed write, the next pass comes this soon."""
WRITERS: Final = 8
"""Writes in flight at once (a first pass over thousands of servers)."""
ACTIONS: Final = ("create", "update", "delete", "label")

Write = Callable[[], Awaitable[tuple[str, bool]]]
"""One write of a pass; says what it was (an ``ACTIONS`` entry) and whether it went through."""


def lupine_api(kube: KubeClient, settings: ServerPolicySettings) -> LupineApi:
    """The mode's calls, confined to the lupine servers' namespace and our policies."""
    labels = ",".join(f"{key}={value}" for key, value in settings.lupine_labels)
    return LupineApi(
        kube,
        namespace=settings.lupine_namespace,
        labels=labels,
        policy_selector=MANAGED_BY_SELECTOR,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LupinePod:
    """A lupine server pod: where it runs and the node label it carries now."""

    name: str
    node: str
    label: str | None


def _lupine_pod(raw: Mapping[str, Any]) -> LupinePod | None:
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return None
    label = (meta.get("labels") or {}).get(NODE_LABEL)
    return LupinePod(name=str(meta.get("name") or ""), node=node, label=label)


class ServerPolicies:
    """The leader's keeper of one NetworkPolicy per server; run with ``await tg.start(run)``."""

    def __init__(
        self,
        api: LupineApi,
        *,
        ledger: Ledger,
        pods: PodIndex,
        inputs: Inputs,
        settings: ServerPolicySettings,
        system_namespace: str,
        leading: Callable[[], bool],
        registry: CollectorRegistry,
        period: float = RECONCILE_SECONDS,
    ) -> None:
        self._api = api
        self._ledger, self._pods, self._inputs = ledger, pods, inputs
        self._settings = settings
        self._system_namespace = system_namespace
        self._leading = leading
        self._period = period
        self._known: dict[str, PolicyRecord] = {}
        self._wake = anyio.Event()
        self._retry = False
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
            transform=_lupine_pod,
            on_change=self.notify,
        )
        self._writes = Counter(
            "rgpu_allocator_server_policy_writes",
            "Writes keeping one NetworkPolicy per server (RGPU_SERVER_POLICIES=on), by action "
            "(create, update, delete, label: a lupine pod given its node label) and outcome "
            "(ok, failed).",
            ["action", "outcome"],
            registry=registry,
        )
        for action in ACTIONS:
            for outcome in ("ok", "failed"):
                self._writes.labels(action, outcome)
        self._passes = Counter(
            "rgpu_allocator_server_policy_passes",
            "Passes over every server's NetworkPolicy made by the elected replica (at least "
            "one per RECONCILE_SECONDS while it leads).",
            registry=registry,
        )
        self._pending = Gauge(
            "rgpu_allocator_server_policies_pending",
            "Servers whose NetworkPolicy did not say what it should after the last pass "
            "(writes failed); 0 when every policy is in place.",
            registry=registry,
        )

    # -- what wakes a pass ----------------------------------------------------------------

    def notify(self, *_: object) -> None:
        """Something a policy is made of changed: run a pass soon."""
        self._wake.set()

    def pod_changed(self, before: PodInfo | None, after: PodInfo | None) -> None:
        """A pod holding a claim got, changed or lost its addresses, or finished."""
        pod = after or before
        if pod is None or not self._ledger.servers_of(pod.uid):
            return
        if _admitted(before) != _admitted(after):
            self.notify()

    def leadership(self, leading: bool) -> None:
        if leading:
            self.notify()

    def _policy_changed(self, change: ObjectChange[PolicyRecord]) -> None:
        if change.after is not None:
            self._remember(change.after)
        elif change.before is not None:
            known = self._known.get(change.before.name)
            if known is not None and newer_or_equal(
                change.resource_version, known.resource_version
            ):
                del self._known[change.before.name]
        self.notify()

    def _remember(self, record: PolicyRecord) -> None:
        known = self._known.get(record.name)
        if known is None or newer_or_equal(record.resource_version, known.resource_version):
            self._known[record.name] = record

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow our policies and the lupine pods, and keep them in line until cancelled."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.policies.run)
            await tg.start(self.lupine_pods.run)
            tg.start_soon(self._follow_claims)
            task_status.started()
            while True:
                with anyio.move_on_after(RETRY_SECONDS if self._retry else self._period):
                    await self._wake.wait()
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
            and self._inputs.view is not None
            and self.policies.synced
            and self.lupine_pods.synced
        )

    async def reconcile(self) -> None:
        """One pass (the leader's, once every cache is in; else nothing)."""
        if not self._ready():
            return
        failures: list[str] = []
        async with anyio.create_task_group() as tg:
            limiter = anyio.CapacityLimiter(WRITERS)
            for name, write in self._work():
                tg.start_soon(self._attempt, limiter, name, write, failures)
        self._retry = bool(failures)
        self._pending.set(len(failures))
        self._passes.inc()

    def _work(self) -> Iterable[tuple[str, Write]]:
        """Every write this pass needs, as (what it is about, the write)."""
        desired = {body["metadata"]["name"]: body for body in self._bodies()}
        for name, body in desired.items():
            known = self._known.get(name)
            if known is None or not known.says(body):
                yield name, self._writer(name, body, known)
        held = set(self._ledger_servers())
        for name, known in tuple(self._known.items()):
            if name not in desired and known.server not in held:
                yield name, self._deleter(name)
        for pod in self.lupine_pods.values.values():
            wanted = node_label(pod.node)
            if pod.label != wanted:
                yield pod.name, self._labeller(pod.name, wanted)

    def _ledger_servers(self) -> Iterable[str]:
        return (r.server for r in self._ledger.leases() if r.claims)

    async def _attempt(
        self,
        limiter: anyio.CapacityLimiter,
        name: str,
        write: Write,
        failures: list[str],
    ) -> None:
        async with limiter:
            if not self._leading():
                return
            action, outcome = await write()
            self._writes.labels(action, "ok" if outcome else "failed").inc()
            if not outcome:
                failures.append(name)

    def _writer(self, name: str, body: dict[str, Any], known: PolicyRecord | None) -> Write:
        async def write() -> tuple[str, bool]:
            action = "create" if known is None else "update"
            try:
                if known is None:
                    reply = await self._api.create_policy(body)
                else:
                    meta = {**body["metadata"], "resourceVersion": known.resource_version}
                    reply = await self._api.replace_policy(name, {**body, "metadata": meta})
            except (KubeConflict, KubeNotFound):
                # Someone wrote (or deleted) it since we last heard: its watch event is on
                # its way and wakes the next pass, which decides on what is there now.
                return action, False
            except KubeError as exc:
                logger.warning("server policy %s: %s failed: %s", name, action, exc)
                return action, False
            record = read_policy(reply)
            if record is not None:
                self._remember(record)
            return action, True

        return write

    def _deleter(self, name: str) -> Write:
        async def delete() -> tuple[str, bool]:
            try:
                await self._api.delete_policy(name)
            except KubeError as exc:
                logger.warning("server policy %s: delete failed: %s", name, exc)
                return "delete", False
            self._known.pop(name, None)
            return "delete", True

        return delete

    def _labeller(self, pod: str, value: str) -> Write:
        async def label() -> tuple[str, bool]:
            try:
                await self._api.label_pod(pod, {NODE_LABEL: value})
            except KubeNotFound:
                return "label", True  # gone: nothing to fence
            except KubeError as exc:
                logger.warning("lupine pod %s: labelling failed: %s", pod, exc)
                return "label", False
            return "label", True

        return label

    # -- what the policies say --------------------------------------------------------------

    def _bodies(self) -> Iterable[dict[str, Any]]:
        view = self._inputs.view
        servers = view.fleet.servers if view is not None else ()
        for server in servers:
            yield policy_body(
                self._fence(server),
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
    """The addresses a holder is admitted from: its valid ones, while it runs (a finished
    pod's address goes back to the pool, and may soon be another pod's)."""
    if pod is None or pod.finished or not pod.bound:
        return ()
    return tuple(ip for ip in pod.ips if _valid(ip))


def _valid(ip: str) -> bool:
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        return False
    return True
