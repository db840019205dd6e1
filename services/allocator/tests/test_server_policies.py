"""Server policies (``RGPU_SERVER_POLICIES=on``) at the service boundary: the real allocator
app on kubesim's apiserver over HTTP, the fleet from a fake discovery, lupine servers that
really listen and run as pods of rgpu-lupine, the simulated network enforcing the policies the
allocator writes, and the kubelet emulator starting pods whose lupine clients connect from
their own addresses."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry

import rgpu_testkit as testkit
from rgpu_allocator.claims import ANNOTATION_CLAIMS, lease_name
from rgpu_allocator.policy_objects import NODE_LABEL, policy_name
from rgpu_contracts import PodRef, PodUID
from rgpu_kubesim import (
    ApiError,
    LupineFleet,
    LupineSpec,
    PodNetwork,
    SimApiServer,
    open_lupine_fleet,
)
from rgpu_kubesim.kubelet import (
    DIAL_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    Dialed,
    KubeletConfig,
    KubeletEmulator,
    dial,
)
from rgpu_kubesim.network import LUPINE_NAMESPACE, place_lupine_pods

pytestmark = pytest.mark.anyio

SERVERS = {"gpu-1": "127.61.0.1", "gpu-2": "127.61.0.2"}
ENDPOINT = "hami.io/lupine-endpoint"
MODE = {"RGPU_SERVER_POLICIES": "on"}


@dataclasses.dataclass(slots=True, kw_only=True)
class Servers:
    """The running pieces a test drives."""

    sim: SimApiServer
    fleet: LupineFleet
    network: PodNetwork
    kubelet: KubeletEmulator
    discovery: testkit.FakeDiscovery

    def endpoint(self, server: str) -> str:
        return self.fleet.by_name(server).endpoint

    def policy(self, server: str) -> dict[str, Any] | None:
        found = self.sim.store.list("networkpolicies", namespace=LUPINE_NAMESPACE)
        return next((p for p in found if p["metadata"]["name"] == policy_name(server)), None)

    def admitted(self, server: str) -> list[str]:
        """The addresses the server's policy admits (ipBlocks)."""
        policy = self.policy(server) or {"spec": {}}
        rules = policy["spec"].get("ingress") or ()
        return [p["ipBlock"]["cidr"] for r in rules for p in r.get("from") or () if "ipBlock" in p]

    def status(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.sim.store.get("pods", name, namespace="ml")["status"]
        return found


@contextlib.asynccontextmanager
async def servers(sim: SimApiServer) -> AsyncIterator[Servers]:
    network = PodNetwork(sim.store)
    config = KubeletConfig(start_delay_seconds=0.05, retry_initial_seconds=0.05)
    async with (
        open_lupine_fleet() as fleet,
        httpx.AsyncClient(base_url=sim.url, timeout=10) as http,
        anyio.create_task_group() as tg,
    ):
        published = []
        for name, address in SERVERS.items():
            gpus = tuple(testkit.gpu_uuid(server=name, index=i) for i in range(2))
            fake = await fleet.start(LupineSpec(name=name, host=address, gpus=gpus))
            published.append(
                testkit.server(name=name, cards=2, endpoint=fake.endpoint, port=fake.port)
            )
        place_lupine_pods(sim.store, fleet)
        await tg.start(network.run)
        fleet.guard(network.guard)
        kubelet = KubeletEmulator(config, http, fleet.get)
        await tg.start(kubelet.run)
        discovery = testkit.FakeDiscovery(testkit.fleet(servers=published))
        yield Servers(sim=sim, fleet=fleet, network=network, kubelet=kubelet, discovery=discovery)
        tg.cancel_scope.cancel()


def gpu_pod(sim: SimApiServer, name: str, *, run_seconds: float = 60) -> PodRef:
    env = [
        {
            "name": "LUPINE_SERVER",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{ENDPOINT}']"}},
        }
    ]
    container = testkit.container_manifest(limits={"nvidia.com/remote-gpu": "1"}, env=env)
    manifest = testkit.pod_manifest(
        name=name,
        namespace="ml",
        scheduler="rgpu-scheduler",
        containers=[container],
        annotations={RUN_SECONDS_ANNOTATION: str(run_seconds)},
        spec={"restartPolicy": "Never"},
    )
    made = sim.store.create("pods", manifest)
    return PodRef(uid=PodUID(made["metadata"]["uid"]), namespace="ml", name=name)


async def hold(client: httpx.AsyncClient, world: Servers, pod: PodRef, kit: Any) -> str:
    """Book, commit and bind ``pod`` as the extender would; the server it got."""
    booked = await client.post("/v1/allocations", json=kit.ask(pod))
    assert booked.status_code == 200, booked.text
    server = str(booked.json()["server"])
    commit = await client.post(f"/v1/allocations/{pod.uid}/commit", json={"node": "client-1"})
    assert commit.status_code == 200, commit.text
    annotations = {ENDPOINT: world.endpoint(server)}
    world.sim.store.bind(pod.name, "client-1", namespace="ml", uid=pod.uid, annotations=annotations)
    return server


def copycat(sim: SimApiServer, name: str, endpoint: str) -> str:
    """A pod that asks for no GPU and connects to ``endpoint`` anyway."""
    manifest = testkit.pod_manifest(
        name=name, namespace="ml", annotations={DIAL_ANNOTATION: endpoint}, node="client-2"
    )
    return str(sim.store.create("pods", manifest)["metadata"]["uid"])


def passes(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("rgpu_allocator_server_policy_passes_total") or 0.0


def writes(registry: CollectorRegistry, action: str) -> float:
    labels = {"action": action, "outcome": "ok"}
    return registry.get_sample_value("rgpu_allocator_server_policy_writes_total", labels) or 0.0


async def test_only_the_holder_reaches_its_server_and_a_copycat_is_refused(
    sim: SimApiServer, kit: Any
) -> None:
    async with (
        servers(sim) as world,
        kit.running_allocator(sim.url, world.discovery, **MODE) as client,
    ):
        # Before anyone holds anything, every server admits discovery only.
        await kit.wait_for(lambda: world.policy("gpu-1") and world.policy("gpu-2"))
        assert world.admitted("gpu-1") == world.admitted("gpu-2") == []
        pod = gpu_pod(sim, "trainer")
        server = await hold(client, world, pod, kit)
        await kit.wait_for(lambda: world.status("trainer").get("phase") == "Running")
        address = world.status("trainer")["podIP"]
        assert world.fleet.by_name(server).clients[pod.uid].address == address
        assert world.admitted(server) == [f"{address}/32"]
        policy = world.policy(server)
        assert policy is not None
        assert policy["metadata"]["annotations"]["rgpu.io/holders"] == "ml/trainer"
        assert policy["spec"]["podSelector"]["matchLabels"][NODE_LABEL] == server
        # A pod that copies the holder's endpoint is reset by the network.
        uid = copycat(sim, "copycat", world.endpoint(server))
        await kit.wait_for(
            lambda: world.kubelet.records.get(uid) and world.kubelet.records[uid].dials
        )
        assert world.kubelet.records[uid].dials == {world.endpoint(server): "reset"}
        assert await world.kubelet.dial(uid, world.endpoint(server)) is Dialed.RESET
        # The holder's own further connections go through; the other server admits nobody.
        assert await world.kubelet.dial(pod.uid, world.endpoint(server)) is Dialed.CONNECTED
        other = "gpu-2" if server == "gpu-1" else "gpu-1"
        assert await world.kubelet.dial(pod.uid, world.endpoint(other)) is Dialed.RESET
        lupines = sim.store.list("pods", namespace=LUPINE_NAMESPACE)
        assert {p["metadata"]["labels"][NODE_LABEL] for p in lupines} == set(SERVERS)


async def test_after_release_the_old_holder_is_refused_and_the_new_one_connects(
    sim: SimApiServer, kit: Any
) -> None:
    async with (
        servers(sim) as world,
        kit.running_allocator(sim.url, world.discovery, **MODE) as client,
    ):
        first = gpu_pod(sim, "first", run_seconds=0.5)
        server = await hold(client, world, first, kit)
        await kit.wait_for(lambda: world.status("first").get("phase") == "Succeeded")
        old = world.status("first")["podIP"]
        # Finished: its address leaves the policy (and its claim is released).
        await kit.wait_for(lambda: world.admitted(server) == [])
        await kit.wait_for(lambda: not claims(sim, server))
        assert await dial(world.endpoint(server), old, timeout=2) is Dialed.RESET
        # Both servers are free again; the next pod may land on either.
        second = gpu_pod(sim, "second")
        landed = await hold(client, world, second, kit)
        await kit.wait_for(lambda: world.status("second").get("phase") == "Running")
        new = world.status("second")["podIP"]
        assert new != old and world.admitted(landed) == [f"{new}/32"]
        assert await world.kubelet.dial(second.uid, world.endpoint(landed)) is Dialed.CONNECTED
        assert await dial(world.endpoint(landed), old, timeout=2) is Dialed.RESET


def claims(sim: SimApiServer, server: str) -> list[Mapping[str, Any]]:
    try:
        lease = sim.store.get("leases", lease_name(server), namespace="rgpu-system")
    except ApiError:
        return []
    found: list[Mapping[str, Any]] = orjson.loads(
        lease["metadata"]["annotations"][ANNOTATION_CLAIMS]
    )
    return found


async def test_a_restarted_allocator_rebuilds_the_policies_from_claims(
    sim: SimApiServer, kit: Any
) -> None:
    async with servers(sim) as world:
        async with kit.running_allocator(sim.url, world.discovery, **MODE) as client:
            pod = gpu_pod(sim, "trainer")
            server = await hold(client, world, pod, kit)
            await kit.wait_for(lambda: world.status("trainer").get("phase") == "Running")
        address = world.status("trainer")["podIP"]
        # A restart with every policy in place writes nothing.
        registry = CollectorRegistry()
        async with kit.running_allocator(sim.url, world.discovery, registry, **MODE):
            await kit.wait_for(lambda: passes(registry) >= 1, timeout=15)
            assert writes(registry, "create") == writes(registry, "update") == 0
            assert writes(registry, "label") == 0
        # Policies lost while no allocator ran: the next one writes them from the claims.
        for name in (policy_name(s) for s in SERVERS):
            sim.store.delete("networkpolicies", name, namespace=LUPINE_NAMESPACE)
        assert await world.kubelet.dial(pod.uid, world.endpoint(server)) is Dialed.CONNECTED
        async with kit.running_allocator(sim.url, world.discovery, **MODE):
            await kit.wait_for(lambda: world.admitted(server) == [f"{address}/32"])
            assert world.policy("gpu-1") and world.policy("gpu-2")
            assert await world.kubelet.dial(pod.uid, world.endpoint(server)) is Dialed.CONNECTED


async def test_a_deleted_or_widened_policy_is_put_back(sim: SimApiServer, kit: Any) -> None:
    registry = CollectorRegistry()
    async with (
        servers(sim) as world,
        kit.running_allocator(sim.url, world.discovery, registry, **MODE) as client,
    ):
        pod = gpu_pod(sim, "trainer")
        server = await hold(client, world, pod, kit)
        await kit.wait_for(lambda: world.status("trainer").get("phase") == "Running")
        address = world.status("trainer")["podIP"]
        sim.store.delete("networkpolicies", policy_name(server), namespace=LUPINE_NAMESPACE)
        await kit.wait_for(lambda: world.admitted(server) == [f"{address}/32"])
        # Someone opens it to the world: the next pass narrows it again.
        widened = world.policy(server)
        assert widened is not None
        widened["spec"]["ingress"].append({"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]})
        sim.store.replace("networkpolicies", widened, namespace=LUPINE_NAMESPACE)
        await kit.wait_for(lambda: world.admitted(server) == [f"{address}/32"])
        assert writes(registry, "create") >= 3 and writes(registry, "update") >= 1
        assert registry.get_sample_value("rgpu_allocator_server_policies_pending") == 0


async def test_with_the_mode_off_no_policy_is_written(sim: SimApiServer, kit: Any) -> None:
    async with servers(sim) as world, kit.running_allocator(sim.url, world.discovery) as client:
        pod = gpu_pod(sim, "trainer")
        server = await hold(client, world, pod, kit)
        await kit.wait_for(lambda: world.status("trainer").get("phase") == "Running")
        uid = copycat(sim, "copycat", world.endpoint(server))
        await kit.wait_for(
            lambda: world.kubelet.records.get(uid) and world.kubelet.records[uid].dials
        )
        # Exclusivity is advisory without the mode: the copycat gets through.
        assert world.kubelet.records[uid].dials == {world.endpoint(server): "connected"}
    assert sim.store.list("networkpolicies", namespace=LUPINE_NAMESPACE) == []


async def test_a_missing_lupine_namespace_delays_the_policies_not_the_allocator(
    sim: SimApiServer, kit: Any
) -> None:
    registry = CollectorRegistry()
    discovery = testkit.FakeDiscovery(testkit.fleet(servers=[testkit.server(name="gpu-1")]))
    async with kit.running_allocator(sim.url, discovery, registry, **MODE) as client:
        # It decides (the fence is background work) while every write is refused.
        dry = await client.post("/v1/allocations", json=kit.ask(gpu_pod(sim, "p"), dry_run=True))
        assert dry.status_code == 200, dry.text
        pending = "rgpu_allocator_server_policies_pending"
        await kit.wait_for(lambda: (registry.get_sample_value(pending) or 0) >= 1)
        sim.store.create("namespaces", {"metadata": {"name": LUPINE_NAMESPACE}})
        await kit.wait_for(
            lambda: sim.store.list("networkpolicies", namespace=LUPINE_NAMESPACE), timeout=15
        )
        await kit.wait_for(lambda: registry.get_sample_value(pending) == 0)
        assert writes(registry, "create") == 1
