"""The NetworkPolicy that fences one lupine server, written once and read back the same way.

lupine has no access control: whoever reaches its port uses the server's GPUs. Where the
cluster's CNI enforces NetworkPolicy and lupine runs as pods, the allocator keeps one policy
per server (``rgpu-server-<server>``, in the lupine servers' namespace) that admits, on the
server's port only:

* discovery's pods, by namespace and label, so probing never stops;
* every current holder's pod addresses (``/32``, ``/128``): a server's claims name its holders,
  and with card granularity that is every pod holding a card of it.

No holder: discovery only. The policy selects the server's lupine pods by the labels every
lupine pod carries plus ``rgpu.io/server-node: <node>``, which the allocator puts on each
lupine pod (a DaemonSet cannot give its pods a label per node). Instances of one node
(``<node>@<port>``) share the node's label and differ by port, so each policy admits its own
holders on its own port only. A lupine pod not labelled yet is selected by none of these: the
mode's standing policy (k8s/components/server-policies) admits only discovery to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rgpu_contracts import prefixed_name

from .claims import MANAGED_BY_LABEL, MANAGED_BY_VALUE

__all__ = [
    "ANNOTATION_HOLDERS",
    "ANNOTATION_SERVER",
    "DISCOVERY_LABELS",
    "NODE_LABEL",
    "Fence",
    "Holder",
    "PolicyRecord",
    "node_label",
    "policy_body",
    "policy_name",
    "read_policy",
]

NODE_LABEL: Final = "rgpu.io/server-node"
"""On each lupine pod: the Node it runs on (hashed past 63 characters, as label values end)."""
ANNOTATION_SERVER: Final = "rgpu.io/server"
ANNOTATION_HOLDERS: Final = "rgpu.io/holders"
"""The holders the policy admits, ``namespace/name`` comma-separated, for ``kubectl``."""
DISCOVERY_LABELS: Final = {"app.kubernetes.io/name": "rgpu-discovery"}
"""discovery's pod labels, as k8s/base/discovery deploys it."""
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
_PREFIX: Final = "rgpu-server-"


def policy_name(server: str) -> str:
    """``rgpu-server-<server>``, hashed when it would not make a valid name."""
    return prefixed_name(_PREFIX, server)


def node_label(node: str) -> str:
    """The ``rgpu.io/server-node`` value for ``node``."""
    return prefixed_name("", node)


@dataclass(frozen=True, slots=True, kw_only=True)
class Holder:
    """A pod holding (cards of) the server, and the addresses it connects from."""

    pod: str
    """``namespace/name``."""
    ips: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fence:
    """Who may reach one server: what its policy says."""

    server: str
    node: str
    port: int
    holders: tuple[Holder, ...]
    """Sorted by pod; only holders whose addresses are known."""


def policy_body(
    fence: Fence,
    *,
    namespace: str,
    lupine_labels: Sequence[tuple[str, str]],
    system_namespace: str,
) -> dict[str, Any]:
    """The NetworkPolicy for ``fence``, as kube-apiserver would store it (defaults spelled
    out, so a stored policy compares equal to the one we would write)."""
    ports = [{"protocol": "TCP", "port": fence.port}]
    probes = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: system_namespace}},
        "podSelector": {"matchLabels": dict(DISCOVERY_LABELS)},
    }
    ingress: list[dict[str, Any]] = [{"from": [probes], "ports": ports}]
    blocks = [{"ipBlock": {"cidr": _cidr(ip)}} for h in fence.holders for ip in h.ips]
    if blocks:
        ingress.append({"from": blocks, "ports": ports})
    selected = {**dict(lupine_labels), NODE_LABEL: node_label(fence.node)}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": policy_name(fence.server),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
            "annotations": {
                ANNOTATION_SERVER: fence.server,
                ANNOTATION_HOLDERS: ",".join(h.pod for h in fence.holders),
            },
        },
        "spec": {
            "podSelector": {"matchLabels": selected},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _cidr(ip: str) -> str:
    # The pod cache admits only addresses inet_pton parses, so a colon is all that tells the
    # families apart; parsing again with ipaddress cost a new leader's first pass 0.2 ms a
    # server.
    return f"{ip}/128" if ":" in ip else f"{ip}/32"


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRecord:
    """One of our policies as last read: enough to tell whether it says what it should."""

    name: str
    server: str
    resource_version: str
    spec: Mapping[str, Any]
    holders: str

    def says(self, body: Mapping[str, Any]) -> bool:
        """Whether this policy already is ``body`` (spec and holders alike)."""
        holders = body["metadata"]["annotations"][ANNOTATION_HOLDERS]
        return bool(self.spec == body["spec"] and self.holders == holders)


def read_policy(raw: Mapping[str, Any]) -> PolicyRecord | None:
    """Read a watched NetworkPolicy; ``None`` for one that is not ours."""
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    server = annotations.get(ANNOTATION_SERVER)
    if not isinstance(server, str) or not server:
        return None
    return PolicyRecord(
        name=str(meta.get("name") or ""),
        server=server,
        resource_version=str(meta.get("resourceVersion") or ""),
        spec=raw.get("spec") or {},
        holders=str(annotations.get(ANNOTATION_HOLDERS) or ""),
    )
