"""NetworkPolicies in the simulated apiserver (over HTTP, as kube-apiserver validates and
defaults them) and enforced by ``PodNetwork`` in front of real fake lupine servers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from rgpu_kubesim import (
    LupineFleet,
    LupineSpec,
    PodNetwork,
    SimApiServer,
    SimOptionError,
    open_lupine_fleet,
)
from rgpu_kubesim.kubelet import DIAL_ANNOTATION, Dialed, KubeletConfig, KubeletEmulator
from rgpu_kubesim.lupine._dial import dial
from rgpu_kubesim.network import LUPINE_LABELS, LUPINE_NAMESPACE, place_lupine_pods
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

PATH = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies"


def policy(name: str, spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def refusal(client: httpx.AsyncClient, spec: dict[str, Any]) -> list[str]:
    answer = await client.post(PATH, json=policy("p", spec))
    assert answer.status_code == 422, answer.text
    assert answer.json()["reason"] == "Invalid"
    return [c["field"] for c in answer.json()["details"]["causes"]]


async def test_a_policy_is_defaulted_as_kube_apiserver_does(client: httpx.AsyncClient) -> None:
    spec = {"podSelector": {}, "ingress": [{"ports": [{"port": 14833}]}], "egress": [{}]}
    made = await client.post(PATH, json=policy("both", spec))
    assert made.status_code == 201, made.text
    assert made.json()["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert made.json()["spec"]["ingress"][0]["ports"] == [{"port": 14833, "protocol": "TCP"}]
    plain = await client.post(PATH, json=policy("plain", {"podSelector": {}}))
    assert plain.json()["spec"]["policyTypes"] == ["Ingress"]
    listed = await client.get(PATH)
    assert [p["metadata"]["name"] for p in listed.json()["items"]] == ["both", "plain"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.podSelector"),
        ({"podSelector": {}, "policyTypes": ["Inbound"]}, "spec.policyTypes[0]"),
        (
            {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "spec.podSelector.matchExpressions[0].values",
        ),
        ({"podSelector": {}, "ingress": [{"from": [{}]}]}, "spec.ingress[0].from[0]"),
        (
            {
                "podSelector": {},
                "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}],
            },
            "spec.ingress[0].from[0]",
        ),
        (
            {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.1"}}]}]},
            "spec.ingress[0].from[0].ipBlock.cidr",
        ),
        (
            {
                "podSelector": {},
                "ingress": [
                    {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}]}
                ],
            },
            "spec.ingress[0].from[0].ipBlock.except[0]",
        ),
        (
            {"podSelector": {}, "ingress": [{"ports": [{"port": 0}]}]},
            "spec.ingress[0].ports[0].port",
        ),
        (
            {"podSelector": {}, "ingress": [{"ports": [{"protocol": "ICMP"}]}]},
            "spec.ingress[0].ports[0].protocol",
        ),
        (
            {"podSelector": {}, "ingress": [{"ports": [{"port": 900, "endPort": 800}]}]},
            "spec.ingress[0].ports[0].endPort",
        ),
        (
            {"podSelector": {}, "ingress": [{"ports": [{"port": "Not_A--Name"}]}]},
            "spec.ingress[0].ports[0].port",
        ),
        (
            {"podSelector": {}, "egress": [{"to": [{"ipBlock": {}}]}]},
            "spec.egress[0].to[0].ipBlock.cidr",
        ),
    ],
)
async def test_an_invalid_policy_is_refused_naming_the_field(
    client: httpx.AsyncClient, spec: dict[str, Any], field: str
) -> None:
    assert field in await refusal(client, spec)


# --- enforcement --------------------------------------------------------------------------

SERVER_ADDRESS = "127.77.0.10"
HOLDER, STRANGER, DISCOVERY = "127.130.0.2", "127.130.0.3", "127.130.0.4"


def running_pod(
    name: str, address: str, *, namespace: str = "default", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"nodeName": "client-1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]},
    }


@contextlib.asynccontextmanager
async def guarded(sim: SimApiServer) -> AsyncIterator[tuple[PodNetwork, LupineFleet]]:
    """A fake lupine on gpu-1 run as a pod of rgpu-lupine, behind the simulated network."""
    network = PodNetwork(sim.store)
    async with open_lupine_fleet() as fleet, anyio.create_task_group() as tg:
        server = await fleet.start(LupineSpec(name="gpu-1", host=SERVER_ADDRESS, gpus=("GPU-1",)))
        place_lupine_pods(sim.store, [server])
        await tg.start(network.run)
        fleet.guard(network.guard)
        yield network, fleet
        tg.cancel_scope.cancel()


async def connects(fleet: LupineFleet, source: str) -> Dialed:
    server = fleet.by_name("gpu-1")
    return await dial(server.endpoint, source, timeout=2.0)


def lupine_policy(name: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    selector = {"matchLabels": {"app.kubernetes.io/name": LUPINE_LABELS["app.kubernetes.io/name"]}}
    return policy(name, {"podSelector": selector, "ingress": ingress}, namespace=LUPINE_NAMESPACE)


async def test_a_server_no_policy_selects_takes_every_connection(sim: SimApiServer) -> None:
    sim.store.create("pods", running_pod("stranger", STRANGER))
    async with guarded(sim) as (_, fleet):
        assert await connects(fleet, STRANGER) is Dialed.CONNECTED
        # A policy elsewhere (another namespace, or selecting other pods) changes nothing.
        sim.store.create("networkpolicies", policy("deny-default", {"podSelector": {}}))
        other = lupine_policy("others", [])
        other["spec"]["podSelector"] = {"matchLabels": {"app": "else"}}
        sim.store.create("networkpolicies", other)
        await anyio.sleep(0.05)
        assert await connects(fleet, STRANGER) is Dialed.CONNECTED


async def test_a_selected_server_takes_only_what_some_rule_allows(sim: SimApiServer) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
    sim.store.create("pods", running_pod("holder", HOLDER))
    sim.store.create("pods", running_pod("stranger", STRANGER))
    discovery = {"app.kubernetes.io/name": "rgpu-discovery"}
    sim.store.create(
        "pods", running_pod("discovery", DISCOVERY, namespace="rgpu-system", labels=discovery)
    )
    # The stranger wears discovery's label, but in the wrong namespace.
    sim.store.patch("pods", "stranger", {"metadata": {"labels": discovery}}, namespace="default")
    async with guarded(sim) as (network, fleet):
        probes = {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "rgpu-system"}
                    },
                    "podSelector": {"matchLabels": discovery},
                }
            ]
        }
        sim.store.create("networkpolicies", lupine_policy("probes", [probes]))
        await eventually(lambda: len(network.policy_names(LUPINE_NAMESPACE)) == 1)
        assert await connects(fleet, DISCOVERY) is Dialed.CONNECTED
        assert await connects(fleet, HOLDER) is Dialed.RESET
        assert await connects(fleet, STRANGER) is Dialed.RESET
        # Policies add up: a second one admits the holder, on the lupine port only.
        port = fleet.by_name("gpu-1").port
        holder = {"from": [{"ipBlock": {"cidr": f"{HOLDER}/32"}}], "ports": [{"port": port}]}
        sim.store.create("networkpolicies", lupine_policy("holder", [holder]))
        await eventually(lambda: len(network.policy_names(LUPINE_NAMESPACE)) == 2)
        assert await connects(fleet, HOLDER) is Dialed.CONNECTED
        assert await connects(fleet, STRANGER) is Dialed.RESET
        refused = [r for r in network.refusals if r.source == STRANGER]
        assert refused and refused[-1].source_pod == "default/stranger"
        assert refused[-1].target == f"{LUPINE_NAMESPACE}/lupine-server-gpu-1"
        assert fleet.by_name("gpu-1").refused >= 3


async def test_ports_except_and_named_ports_are_honoured(sim: SimApiServer) -> None:
    sim.store.create("pods", running_pod("holder", HOLDER))
    async with guarded(sim) as (network, fleet):
        # The wrong port, then an except carving the holder out: still refused.
        block = {"ipBlock": {"cidr": "127.130.0.0/16", "except": [f"{HOLDER}/32"]}}
        sim.store.create("networkpolicies", lupine_policy("a", [{"from": [block]}]))
        wrong = {"from": [{"ipBlock": {"cidr": f"{HOLDER}/32"}}], "ports": [{"port": 1}]}
        sim.store.create("networkpolicies", lupine_policy("b", [wrong]))
        await eventually(lambda: len(network.policy_names(LUPINE_NAMESPACE)) == 2)
        assert await connects(fleet, HOLDER) is Dialed.RESET
        assert await connects(fleet, STRANGER) is Dialed.CONNECTED  # inside the block
        named = {"from": [{"ipBlock": {"cidr": f"{HOLDER}/32"}}], "ports": [{"port": "lupine"}]}
        sim.store.create("networkpolicies", lupine_policy("c", [named]))
        await eventually(lambda: len(network.policy_names(LUPINE_NAMESPACE)) == 3)
        assert await connects(fleet, HOLDER) is Dialed.CONNECTED
        # Deleting the policy that admitted it takes it back.
        sim.store.delete("networkpolicies", "c", namespace=LUPINE_NAMESPACE)
        await eventually(lambda: len(network.policy_names(LUPINE_NAMESPACE)) == 2)
        assert await connects(fleet, HOLDER) is Dialed.RESET


async def test_a_lupine_pod_runs_ready_on_the_pod_network_at_its_servers_port(
    sim: SimApiServer,
) -> None:
    async with guarded(sim) as (_, fleet):
        server = fleet.by_name("gpu-1")
        pod = sim.store.get("pods", "lupine-server-gpu-1", namespace=LUPINE_NAMESPACE)
    (container,) = pod["spec"]["containers"]
    assert not pod["spec"]["hostNetwork"] and pod["spec"]["nodeName"] == "gpu-1"
    assert container["ports"][0]["hostPort"] == container["ports"][0]["containerPort"]
    assert container["ports"][0]["hostPort"] == server.port
    status = pod["status"]
    assert status["phase"] == "Running" and status["podIP"].startswith("127.255.")
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert [c["ready"] for c in status["containerStatuses"]] == [True]


async def test_a_host_network_server_is_governed_by_no_policy(sim: SimApiServer) -> None:
    async with guarded(sim) as (network, fleet):
        sim.store.create("networkpolicies", lupine_policy("deny", []))
        await eventually(lambda: len(network.policy_names(LUPINE_NAMESPACE)) == 1)
        assert await connects(fleet, STRANGER) is Dialed.RESET
        # The same server as a host-network pod (lupine-server's DaemonSet as shipped).
        pod = sim.store.get("pods", "lupine-server-gpu-1", namespace=LUPINE_NAMESPACE)
        sim.store.delete(
            "pods", pod["metadata"]["name"], namespace=LUPINE_NAMESPACE, grace_period_seconds=0
        )
        pod["metadata"] = {"name": "host", "namespace": LUPINE_NAMESPACE, "labels": LUPINE_LABELS}
        pod["spec"]["hostNetwork"] = True
        sim.store.create("pods", pod)
        server = fleet.by_name("gpu-1")
        await eventually(lambda: network.admits(node="gpu-1", port=server.port, source=STRANGER))
        assert await connects(fleet, STRANGER) is Dialed.CONNECTED


# --- the kubelet's pods connect from their own address ----------------------------------

FAST = KubeletConfig(
    start_delay_seconds=0.02,
    default_run_seconds=30,
    retry_initial_seconds=0.02,
    lupine_connect_seconds=0.3,
)


def gpu_pod(name: str, endpoint: str, **annotations: str) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "cuda-app:1",
        "env": [{"name": "LUPINE_SERVER", "value": endpoint}],
        "resources": {"limits": {"nvidia.com/remote-gpu": "1"}},
    }
    meta = {"name": name, "namespace": "default", "annotations": annotations}
    return {"metadata": meta, "spec": {"restartPolicy": "Never", "containers": [container]}}


@contextlib.asynccontextmanager
async def kubelet(
    sim: SimApiServer, fleet: LupineFleet, config: KubeletConfig = FAST
) -> AsyncIterator[KubeletEmulator]:
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as http:
        emulator = KubeletEmulator(config, http, fleet.get)
        async with anyio.create_task_group() as tg:
            await tg.start(emulator.run)
            yield emulator
            tg.cancel_scope.cancel()


def start(sim: SimApiServer, manifest: dict[str, Any]) -> str:
    uid = str(sim.store.create("pods", manifest)["metadata"]["uid"])
    sim.store.bind(manifest["metadata"]["name"], "client-1")
    return uid


def status(sim: SimApiServer, name: str) -> dict[str, Any]:
    found: dict[str, Any] = sim.store.get("pods", name, namespace="default")["status"]
    return found


async def test_a_gpu_pod_no_policy_admits_fails_naming_the_reset(sim: SimApiServer) -> None:
    async with guarded(sim) as (network, fleet), kubelet(sim, fleet) as emulator:
        sim.store.create("networkpolicies", lupine_policy("deny", []))
        await eventually(lambda: network.policy_names(LUPINE_NAMESPACE) == ("deny",))
        uid = start(sim, gpu_pod("trainer", fleet.by_name("gpu-1").endpoint))
        await eventually(lambda: status(sim, "trainer").get("phase") == "Failed")
    record = emulator.records[uid]
    assert "connection was reset" in status(sim, "trainer")["message"]
    assert record.address.startswith("127.130.") and record.address in record.message
    assert not fleet.by_name("gpu-1").clients


async def test_a_gpu_pod_connects_once_a_policy_admits_its_reported_address(
    sim: SimApiServer,
) -> None:
    config = KubeletConfig(start_delay_seconds=0.02, default_run_seconds=30)
    async with guarded(sim) as (network, fleet), kubelet(sim, fleet, config) as emulator:
        server = fleet.by_name("gpu-1")
        sim.store.create("networkpolicies", lupine_policy("deny", []))
        await eventually(lambda: network.policy_names(LUPINE_NAMESPACE) == ("deny",))
        uid = start(sim, gpu_pod("trainer", server.endpoint))
        # The address is reported while the containers are still being created.
        await eventually(lambda: bool(status(sim, "trainer").get("podIP")))
        assert status(sim, "trainer")["phase"] == "Pending"
        address = status(sim, "trainer")["podIP"]
        admit = {"from": [{"ipBlock": {"cidr": f"{address}/32"}}]}
        sim.store.create("networkpolicies", lupine_policy("trainer", [admit]))
        await eventually(lambda: status(sim, "trainer").get("phase") == "Running")
        assert server.clients[uid].address == address
        assert emulator.records[uid].gpus == ("GPU-1",)


async def test_a_pod_dialling_a_server_it_was_not_given_is_reset(sim: SimApiServer) -> None:
    async with guarded(sim) as (network, fleet), kubelet(sim, fleet) as emulator:
        endpoint = fleet.by_name("gpu-1").endpoint
        sim.store.create("networkpolicies", lupine_policy("deny", []))
        await eventually(lambda: network.policy_names(LUPINE_NAMESPACE) == ("deny",))
        copied = {"metadata": {"name": "copycat", "namespace": "default"}}
        copied["metadata"]["annotations"] = {DIAL_ANNOTATION: endpoint}
        copied["spec"] = {"containers": [{"name": "c", "image": "busybox"}]}
        uid = start(sim, copied)
        await eventually(lambda: status(sim, "copycat").get("phase") == "Running")
        assert emulator.records[uid].dials == {endpoint: "reset"}
        assert await emulator.dial(uid, endpoint) is Dialed.RESET
        # Admitted by address, the same pod gets through; the kubelet dials from that address.
        address = emulator.records[uid].address
        admit = {"from": [{"ipBlock": {"cidr": f"{address}/32"}}]}
        sim.store.create("networkpolicies", lupine_policy("copycat", [admit]))
        await eventually(lambda: len(network.policy_names(LUPINE_NAMESPACE)) == 2)
        assert await emulator.dial(uid, endpoint) is Dialed.CONNECTED
        with pytest.raises(SimOptionError):
            await emulator.dial("no-such-uid", endpoint)
