"""Extender ↔ allocator ↔ discovery in one process: the real apps wired through ASGITransport
(no sockets between them), the real kubernetes_asyncio client against kubesim over HTTP."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager

import rgpu_allocator
import rgpu_discovery
import rgpu_extender
from rgpu_allocator.settings import AllocatorSettings
from rgpu_discovery.settings import DiscoverySettings
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import SimApiServer, run_apiserver
from rgpu_testkit import node_manifest, register_annotation, register_card

pytestmark = pytest.mark.anyio

Load = Callable[[str], Any]

AUTH = {
    "RGPU_AUTH": "tokenreview",
    "RGPU_ALLOCATION_CALLERS": "system:serviceaccount:rgpu-system:rgpu-extender",
}
"""Authenticated as k8s/ deploys it; each service mints its token (RGPU_TOKEN_ACCOUNT)."""


async def extender_token(sim_url: str) -> str:
    """The extender's token for the allocator, minted by TokenRequest (what its kubelet would
    project)."""
    path = "/api/v1/namespaces/rgpu-system/serviceaccounts/rgpu-extender/token"
    async with httpx.AsyncClient(base_url=sim_url, timeout=10) as api:
        answer = await api.post(path, json={"spec": {"audiences": ["rgpu-allocator"]}})
    token: str = answer.json()["status"]["token"]
    return token


def _node(name: str, *, server: bool, rack: str = "r1") -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "topology.rgpu.io/rack": rack}
    annotations = {}
    if server:
        labels["hami.io/lupine-server"] = "14833"
        cards = (register_card(uuid=f"GPU-{name}-{i}", index=i) for i in range(2))
        annotations["hami.io/node-nvidia-register"] = register_annotation(cards)
    return node_manifest(name=name, labels=labels, annotations=annotations, address="127.0.0.2")


@dataclass
class Wired:
    sim: SimApiServer
    extender: httpx.AsyncClient
    allocator: httpx.AsyncClient


@pytest.fixture
async def wired() -> AsyncIterator[Wired]:
    async with run_apiserver() as sim:
        for namespace in ("ml-team", "rgpu-system"):
            sim.store.create("namespaces", {"metadata": {"name": namespace}})
        for name, server in (("gpu-node-1", False), ("gpu-node-2", True), ("cpu-node-1", False)):
            sim.store.create("nodes", _node(name, server=server))
        for account in ("rgpu-allocator", "rgpu-extender"):
            meta = {"name": account, "namespace": "rgpu-system"}
            sim.store.create("serviceaccounts", {"metadata": meta})
        env = {"RGPU_KUBE_URL": sim.url, "RGPU_LOG_FORMAT": "text", **AUTH}
        discovery = rgpu_discovery.create_app(DiscoverySettings.from_env(env))
        async with LifespanManager(discovery) as d:
            to_discovery = httpx.ASGITransport(app=d.app)
            allocator = rgpu_allocator.create_app(
                AllocatorSettings.from_env({**env, "RGPU_TOKEN_ACCOUNT": "rgpu-allocator"}),
                discovery_transport=to_discovery,
            )
            async with LifespanManager(allocator) as a:
                to_allocator = httpx.ASGITransport(app=a.app)
                extender = rgpu_extender.create_app(
                    ExtenderSettings.from_env({**env, "RGPU_TOKEN_ACCOUNT": "rgpu-extender"}),
                    allocator_transport=to_allocator,
                    discovery_transport=to_discovery,
                )
                async with (
                    LifespanManager(extender) as e,
                    httpx.AsyncClient(
                        transport=httpx.ASGITransport(app=e.app), base_url="http://ext"
                    ) as ext,
                    httpx.AsyncClient(
                        transport=to_allocator,
                        base_url="http://alloc",
                        headers={"Authorization": f"Bearer {await extender_token(sim.url)}"},
                    ) as alloc,
                ):
                    yield Wired(sim=sim, extender=ext, allocator=alloc)


def _create_fixture_pod(wired: Wired, args: dict[str, Any], name: str) -> dict[str, Any]:
    pod = copy.deepcopy(args["Pod"])
    pod["metadata"] = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")}
    pod["metadata"]["name"] = name
    pod.pop("status")
    return wired.sim.store.create("pods", pod, namespace="ml-team")


async def _filter(wired: Wired, args: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """Filter like kube-scheduler: an ``Error`` (inventory still syncing at start) means retry."""
    body = {**args, "Pod": pod}
    with anyio.fail_after(10):
        for _ in range(1000):
            reply = (await wired.extender.post("/filter", json=body)).json()
            if not reply["Error"]:
                break
            await anyio.sleep(0.05)
    return dict(reply)


async def test_filter_then_bind_puts_endpoint_on_pod_in_the_binding(
    wired: Wired, load_fixture: Load
) -> None:
    args = load_fixture("k8s/extender-filter-args.json")
    pod = _create_fixture_pod(wired, args, "trainer-0")

    result = await _filter(wired, args, pod)
    assert result["Error"] == ""
    assert result["NodeNames"] == ["gpu-node-1", "cpu-node-1"]
    assert result["FailedAndUnresolvableNodes"] == {
        "gpu-node-2": pytest.approx(result["FailedAndUnresolvableNodes"]["gpu-node-2"])
    }

    bind = {**load_fixture("k8s/extender-bind-args.json"), "PodUID": pod["metadata"]["uid"]}
    assert (await wired.extender.post("/bind", json=bind)).json() == {"Error": ""}

    bound = wired.sim.store.get("pods", "trainer-0", namespace="ml-team")
    annotations = bound["metadata"]["annotations"]
    assert bound["spec"]["nodeName"] == "gpu-node-1"
    assert annotations["hami.io/lupine-endpoint"] == "127.0.0.2:14833"
    devices = (
        "gpu-node-2/GPU-gpu-node-2-0,RemoteGPU,40960,100:"
        "gpu-node-2/GPU-gpu-node-2-1,RemoteGPU,40960,100:;"
    )
    assert annotations["hami.io/remote-gpu-devices-allocated"] == devices
    assert annotations["hami.io/remote-gpu-devices-to-allocate"] == devices


async def test_second_pod_is_refused_with_hami_reason_while_the_server_is_held(
    wired: Wired, load_fixture: Load
) -> None:
    args = load_fixture("k8s/extender-filter-args.json")
    first = _create_fixture_pod(wired, args, "trainer-0")
    second = _create_fixture_pod(wired, args, "trainer-1")
    assert (await _filter(wired, args, first))["Error"] == ""

    refused = await _filter(wired, args, second)
    assert refused["Error"] == ""
    assert refused["NodeNames"] is None or refused["NodeNames"] == []
    assert set(refused["FailedNodes"]) == {"gpu-node-1", "cpu-node-1"}
    assert "2/2 ExclusiveDeviceAllocateConflict" in refused["FailedNodes"]["gpu-node-1"]

    assert (
        await wired.allocator.delete(f"/v1/allocations/{first['metadata']['uid']}")
    ).status_code == 204
    assert (await _filter(wired, args, second))["NodeNames"] == ["gpu-node-1", "cpu-node-1"]


def _samples(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def _read_from_mirror(wired: Wired) -> float:
    text = (await wired.extender.get("/metrics")).text
    return _samples(text, "rgpu_extender_outcomes_total", verb="filter", outcome="booked")


async def _asked_allocator(wired: Wired) -> float:
    text = (await wired.allocator.get("/metrics")).text
    return _samples(text, "rgpu_allocator_decisions_total")


async def test_an_admitted_pods_filter_reads_its_booking_without_asking_the_allocator(
    wired: Wired, load_fixture: Load
) -> None:
    args = load_fixture("k8s/extender-filter-args.json")
    manifest = copy.deepcopy(args["Pod"])
    manifest["metadata"] = {"name": "admitted-0"}
    manifest.pop("status")
    manifest["spec"]["schedulingGates"] = [{"name": "rgpu.io/admission"}]
    wired.sim.store.create("pods", manifest, namespace="ml-team")

    def lifted() -> bool:
        got = wired.sim.store.get("pods", "admitted-0", namespace="ml-team")
        return not got["spec"].get("schedulingGates")

    with anyio.fail_after(10):
        while not lifted():
            await anyio.sleep(0.02)
        pod = wired.sim.store.get("pods", "admitted-0", namespace="ml-team")
        while not await _read_from_mirror(wired):
            await _filter(wired, args, pod)
            await anyio.sleep(0.02)
    asked = await _asked_allocator(wired)
    for _ in range(3):
        result = await _filter(wired, args, pod)
        assert result["NodeNames"] == ["gpu-node-1", "cpu-node-1"]
    assert await _read_from_mirror(wired) >= 4
    assert await _asked_allocator(wired) == asked
