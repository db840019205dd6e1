"""The simulated cluster's CNI, as far as NetworkPolicy goes: which pod owns an address, which
pod a node port forwards to, and whether the policies let a connection in.

rgpu's server-policies mode is only worth something if a pod that is not a server's holder
cannot reach the server, so the simulator must refuse such connections the way a
policy-enforcing CNI does. ``PodNetwork`` follows the store (namespaces, pods,
NetworkPolicies) like a CNI agent follows the apiserver, and answers ``admits`` for a
connection arriving at a node's port: the pod that declares that ``hostPort`` on that node is
the destination (its container port is what the policies' ports name); a port no pod
declares, or a host-network pod's, is not governed by any policy. The rule itself is
``_ingress``. Put it in front of fake lupine servers with ``LupineFleet.guard(network.guard)``;
``place_lupine_pods`` writes the pods that stand for them, as a lupine DaemonSet would run.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus

from rgpu_kubesim.apiserver.storage import Store
from rgpu_kubesim.lupine import FakeLupine
from rgpu_kubesim.network._ingress import (
    Arrival,
    ContainerPort,
    PodView,
    ingress_allowed,
    pod_view,
)
from rgpu_kubesim.network._lupine_pods import (
    LUPINE_LABELS,
    LUPINE_NAMESPACE,
    lupine_pod,
    place_lupine_pods,
)

__all__ = [
    "LUPINE_LABELS",
    "LUPINE_NAMESPACE",
    "PodNetwork",
    "PodView",
    "Refusal",
    "lupine_pod",
    "place_lupine_pods",
]

logger = logging.getLogger(__name__)

JsonObj = dict[str, Any]
RECENT: Final = 1000
"""Refusals remembered for tests and for the curious (the oldest are forgotten)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A connection the policies refused: where it went and where it came from."""

    node: str
    port: int
    source: str
    target: str
    """The destination pod, ``namespace/name``."""
    source_pod: str | None
    """The pod owning ``source`` (``namespace/name``), ``None`` for an address of no pod."""


class PodNetwork:
    """Pod addresses, node ports and NetworkPolicies, followed from a ``Store``.

    Run with ``await tg.start(network.run)`` (started once the three lists are in), from the
    event loop that runs the simulated apiserver.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pods: dict[str, PodView] = {}
        self._owners: dict[str, str] = {}
        self._node_ports: dict[tuple[str, int], tuple[str, ContainerPort]] = {}
        self._policies: dict[str, dict[str, JsonObj]] = {}
        self._namespaces: dict[str, Mapping[str, str]] = {}
        self.refusals: deque[Refusal] = deque(maxlen=RECENT)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the store until cancelled."""
        follows: tuple[tuple[str, Callable[[str, JsonObj], None]], ...] = (
            ("namespaces", self._namespace),
            ("pods", self._pod),
            ("networkpolicies", self._policy),
        )
        async with anyio.create_task_group() as tg:
            for resource, apply in follows:
                await tg.start(self._follow, resource, apply)
            task_status.started()

    async def _follow(
        self,
        resource: str,
        apply: Callable[[str, JsonObj], None],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        # The list and its version are read without awaiting in between: nothing is missed.
        version = self._store.resource_version
        for obj in self._store.list(resource):
            apply("ADDED", obj)
        # An audit watch: never cut by injected faults (they are for rgpu's clients, not the
        # network) nor by falling behind.
        async with self._store.watch(resource, resource_version=str(version), audit=True) as seen:
            task_status.started()
            async for event in seen:
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    apply(str(event["type"]), event["object"])

    # -- the indexes ------------------------------------------------------------------------

    def _namespace(self, kind: str, namespace: JsonObj) -> None:
        name = str(namespace["metadata"]["name"])
        if kind == "DELETED":
            self._namespaces.pop(name, None)
        else:
            self._namespaces[name] = dict(namespace["metadata"].get("labels") or {})

    def _policy(self, kind: str, policy: JsonObj) -> None:
        meta = policy["metadata"]
        held = self._policies.setdefault(str(meta.get("namespace") or ""), {})
        if kind == "DELETED":
            held.pop(str(meta["name"]), None)
        else:
            held[str(meta["name"])] = policy

    def _pod(self, kind: str, pod: JsonObj) -> None:
        view = pod_view(pod)
        self._unindex(self._pods.pop(view.uid, None))
        if kind == "DELETED":
            return
        self._pods[view.uid] = view
        if not view.running:
            return
        if not view.host_network:
            self._owners.update(dict.fromkeys(view.ips, view.uid))
        for port in view.ports:
            forwarded = port.number if view.host_network else port.host_port
            if forwarded is not None and port.protocol == "TCP":
                self._node_ports[(view.node, forwarded)] = (view.uid, port)

    def _unindex(self, view: PodView | None) -> None:
        if view is None:
            return
        for ip in view.ips:
            if self._owners.get(ip) == view.uid:
                del self._owners[ip]
        for key in [k for k, (uid, _) in self._node_ports.items() if uid == view.uid]:
            del self._node_ports[key]

    # -- answers ----------------------------------------------------------------------------

    def policy_names(self, namespace: str) -> tuple[str, ...]:
        """The NetworkPolicies of ``namespace`` as this network knows them (sorted)."""
        return tuple(sorted(self._policies.get(namespace, {})))

    def owner(self, address: str) -> PodView | None:
        """The running pod whose address ``address`` is (host-network pods own none)."""
        uid = self._owners.get(address)
        return None if uid is None else self._pods.get(uid)

    def admits(self, *, node: str, port: int, source: str) -> bool:
        """Whether a TCP connection from ``source`` to ``node``'s port ``port`` gets in."""
        found = self._node_ports.get((node, port))
        if found is None:
            return True
        uid, container_port = found
        target = self._pods[uid]
        arrival = Arrival(
            target=target, port=container_port, address=source, source=self.owner(source)
        )
        policies = self._policies.get(target.namespace, {}).values()
        if ingress_allowed(policies, arrival, self._namespaces.get):
            return True
        self._refused(node, port, arrival)
        return False

    def guard(self, server: FakeLupine, source: str) -> bool:
        """``LupineFleet.guard``'s question: may ``source`` reach this fake lupine?"""
        return self.admits(node=server.node, port=server.port, source=source)

    def _refused(self, node: str, port: int, arrival: Arrival) -> None:
        target = f"{arrival.target.namespace}/{arrival.target.name}"
        source = arrival.source
        refusal = Refusal(
            node=node,
            port=port,
            source=arrival.address,
            target=target,
            source_pod=None if source is None else f"{source.namespace}/{source.name}",
        )
        self.refusals.append(refusal)
        logger.debug("network: refused %s -> %s:%d (%s)", arrival.address, node, port, target)
