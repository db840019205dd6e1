"""The simulated cluster as one whose CNI enforces NetworkPolicy, for the server-policies mode
(``StackOptions(server_policies=True)``, ``rgpu up --sim --server-policies``).

What k8s/components/server-policies sets up in a cluster is set up here the same way: lupine
runs as pods of rgpu-lupine on the pod network, the standing policy admits only discovery to
them, and the services run with ``RGPU_SERVER_POLICIES=on``. The simulated network
(``rgpu_kubesim.PodNetwork``) then stands in front of every fake lupine server and refuses
what the policies do not admit. The services run as processes on this host and connect from
127.0.0.1; the discovery pod written here owns that address, so the policies select
discovery's probes by namespace and label, as they would in a cluster.
"""

from __future__ import annotations

from typing import Any, Final

from anyio.abc import TaskGroup

from rgpu_kubesim import PodNetwork, SimApiServer
from rgpu_kubesim.fleet import SeededFleet
from rgpu_kubesim.network import LUPINE_LABELS, LUPINE_NAMESPACE, place_lupine_pods

__all__ = ["SERVER_POLICIES_ENV", "STANDING_POLICY", "discovery_pod", "enforce", "fence_servers"]

SERVER_POLICIES_ENV: Final = {"RGPU_SERVER_POLICIES": "on"}
"""What the component merges into the settings ConfigMap."""

STANDING_POLICY: Final[dict[str, Any]] = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "rgpu-lupine-probes-only", "namespace": LUPINE_NAMESPACE},
    "spec": {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "lupine-server"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "rgpu-system"}
                        },
                        "podSelector": {
                            "matchLabels": {"app.kubernetes.io/name": "rgpu-discovery"}
                        },
                    }
                ]
            }
        ],
    },
}
"""k8s/components/server-policies/standing-policy.yaml, word for word (tests/test_manifests.py
holds the two equal)."""

DISCOVERY_ADDRESS: Final = "127.0.0.1"
"""Where the service processes' connections come from."""


def discovery_pod(namespace: str, node: str | None) -> dict[str, Any]:
    """The pod standing for the discovery processes: Running, labelled as k8s/base deploys
    discovery, owning the address the processes connect from."""
    spec: dict[str, Any] = {"containers": [{"name": "discovery", "image": "rgpu-discovery"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "rgpu-discovery",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "rgpu-discovery"},
        },
        "spec": spec,
        "status": {
            "phase": "Running",
            "podIP": DISCOVERY_ADDRESS,
            "podIPs": [{"ip": DISCOVERY_ADDRESS}],
        },
    }


def fence_servers(sim: SimApiServer, fleet: SeededFleet, namespace: str) -> None:
    """Write what the component installs: lupine as pods, the standing policy, and the
    discovery pod (before the services start, so their first look sees it all)."""
    place_lupine_pods(sim.store, fleet.lupine, labels=LUPINE_LABELS)
    sim.store.create("networkpolicies", STANDING_POLICY)
    node = fleet.plan.clients[0].name if fleet.plan.clients else None
    sim.store.create("pods", discovery_pod(namespace, node))


async def enforce(tg: TaskGroup, sim: SimApiServer, fleet: SeededFleet) -> PodNetwork:
    """Start the simulated network and put it in front of every fake lupine server."""
    network = PodNetwork(sim.store)
    await tg.start(network.run)
    fleet.lupine.guard(network.guard)
    return network
