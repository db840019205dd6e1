"""Whether a NetworkPolicy-enforcing CNI lets a connection into a pod: the rule, pure.

Standard NetworkPolicy semantics, ingress only (rgpu's servers need nothing else):

* a pod that no ingress policy of its namespace selects accepts every connection;
* a pod selected by at least one accepts only what some rule of one of them allows (policies
  add up, none subtracts): a rule matches when one of its ``ports`` matches (none listed: every
  port) and one of its ``from`` peers matches (none listed: every source);
* a port entry matches the destination's container port (by number, by range up to
  ``endPort``, or by the container port's name) and protocol;
* an ``ipBlock`` peer matches a source address inside ``cidr`` and outside every ``except``
  (pod addresses included, as Calico and most CNIs do); a ``podSelector`` peer matches pods of
  the policy's namespace with those labels, a ``namespaceSelector`` peer pods of the namespaces
  with those labels, both together pods matching both. A source that is no pod matches only
  ``ipBlock`` peers;
* host-network pods are selected by no policy (the node's own address carries their traffic,
  which NetworkPolicy does not govern on mainstream CNIs).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import labels_match, selector_from_object

JsonObj = Mapping[str, Any]
NamespaceLabels = Callable[[str], Mapping[str, str] | None]
"""A namespace's labels, ``None`` when it does not exist."""

TERMINAL = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerPort:
    """One declared container port, and the node port that forwards to it (if any)."""

    name: str
    number: int
    host_port: int | None
    protocol: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PodView:
    """What the rule reads of a pod."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    node: str
    ips: tuple[str, ...]
    host_network: bool
    ports: tuple[ContainerPort, ...]
    running: bool
    """Neither finished nor without a node: its address, if any, is its own."""


def pod_view(pod: JsonObj) -> PodView:
    """Read a stored pod."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    ips = tuple(str(e.get("ip")) for e in status.get("podIPs") or () if e.get("ip"))
    if not ips and status.get("podIP"):
        ips = (str(status["podIP"]),)
    node = str(spec.get("nodeName") or "")
    return PodView(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        labels=dict(meta.get("labels") or {}),
        node=node,
        ips=ips,
        host_network=bool(spec.get("hostNetwork")),
        ports=tuple(_ports(spec)),
        running=bool(node) and status.get("phase") not in TERMINAL,
    )


def _ports(spec: JsonObj) -> Iterable[ContainerPort]:
    for container in spec.get("containers") or ():
        for port in container.get("ports") or ():
            yield ContainerPort(
                name=str(port.get("name") or ""),
                number=int(port.get("containerPort") or 0),
                host_port=int(port["hostPort"]) if port.get("hostPort") else None,
                protocol=str(port.get("protocol") or "TCP"),
            )


def isolating(policies: Iterable[JsonObj], target: PodView) -> list[JsonObj]:
    """The ingress policies (of ``target``'s namespace) that select ``target``."""
    if target.host_network:
        return []
    return [p for p in policies if _selects(p, target)]


def _selects(policy: JsonObj, target: PodView) -> bool:
    spec = policy.get("spec") or {}
    if "Ingress" not in (spec.get("policyTypes") or ("Ingress",)):
        return False
    return _matches(spec.get("podSelector"), target.labels)


def _matches(selector: Any, labels: Mapping[str, str]) -> bool:
    try:
        return labels_match(selector_from_object(selector), labels)
    except ApiError:
        return False  # validation refuses such selectors; a stored one selects nothing


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    """A connection arriving at ``target``'s container port ``port`` from ``address``
    (``source``: the pod owning that address, if any)."""

    target: PodView
    port: ContainerPort
    address: str
    source: PodView | None


def ingress_allowed(
    policies: Iterable[JsonObj], arrival: Arrival, namespace_labels: NamespaceLabels
) -> bool:
    """Whether ``arrival`` gets in, given every policy of the target's namespace."""
    selecting = isolating(policies, arrival.target)
    if not selecting:
        return True
    return any(
        _rule_allows(rule, policy, arrival, namespace_labels)
        for policy in selecting
        for rule in (policy.get("spec") or {}).get("ingress") or ()
    )


def _rule_allows(
    rule: JsonObj, policy: JsonObj, arrival: Arrival, namespace_labels: NamespaceLabels
) -> bool:
    ports, peers = rule.get("ports") or (), rule.get("from") or ()
    if ports and not any(_port_matches(p, arrival.port) for p in ports):
        return False
    namespace = str(policy["metadata"].get("namespace") or "")
    return not peers or any(_peer_matches(p, namespace, arrival, namespace_labels) for p in peers)


def _port_matches(entry: JsonObj, port: ContainerPort) -> bool:
    if str(entry.get("protocol") or "TCP") != port.protocol:
        return False
    wanted = entry.get("port")
    if wanted is None:
        return True
    if isinstance(wanted, str):
        return bool(port.name) and wanted == port.name
    end = entry.get("endPort")
    return int(wanted) <= port.number <= int(end if end is not None else wanted)


def _peer_matches(
    peer: JsonObj, namespace: str, arrival: Arrival, namespace_labels: NamespaceLabels
) -> bool:
    block = peer.get("ipBlock")
    if block is not None:
        return _in_block(block, arrival.address)
    source = arrival.source
    if source is None:
        return False
    by_namespace = peer.get("namespaceSelector")
    if by_namespace is None:
        in_scope = source.namespace == namespace
    else:
        in_scope = _matches(by_namespace, namespace_labels(source.namespace) or {})
    return in_scope and _matches(peer.get("podSelector"), source.labels)


def _in_block(block: JsonObj, address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
        network = ipaddress.ip_network(str(block.get("cidr")), strict=False)
        excluded = [ipaddress.ip_network(str(e), strict=False) for e in block.get("except") or ()]
    except ValueError:
        return False
    return ip in network and not any(ip in e for e in excluded)
