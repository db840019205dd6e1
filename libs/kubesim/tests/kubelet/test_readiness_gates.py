"""Readiness gates (``spec.readinessGates``) as the kubelet counts them in Ready: a condition a
controller writes through pods/status (here with the unmodified kubernetes_asyncio client)
decides Ready together with the containers, and the kubelet's own writes keep it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest
from kubernetes_asyncio import client as k8s

from rgpu_kubesim import SimApiServer
from rgpu_kubesim.kubelet import RUN_SECONDS_ANNOTATION, KubeletConfig, KubeletEmulator
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

GATE = "rgpu.io/remote-gpu-ready"
Manifest = Callable[..., dict[str, Any]]
Start = Callable[..., contextlib.AbstractAsyncContextManager[KubeletEmulator]]


@pytest.fixture
def kubelet(client: httpx.AsyncClient) -> Start:
    @contextlib.asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[KubeletEmulator]:
        config = KubeletConfig(**{"start_delay_seconds": 0.02, **overrides})
        emulator = KubeletEmulator(config, client, lambda _: None)
        async with anyio.create_task_group() as tg:
            await tg.start(emulator.run)
            yield emulator
            tg.cancel_scope.cancel()

    return start


@pytest.fixture
async def core(sim: SimApiServer) -> AsyncIterator[k8s.CoreV1Api]:
    async with k8s.ApiClient(k8s.Configuration(host=sim.url)) as api:
        yield k8s.CoreV1Api(api)


def gated_pod(pod: Manifest, name: str = "trainer", run_seconds: str = "60") -> dict[str, Any]:
    body = pod(name, metadata={"annotations": {RUN_SECONDS_ANNOTATION: run_seconds}})
    body["spec"]["readinessGates"] = [{"conditionType": GATE}]
    return body


def conditions(sim: SimApiServer, name: str = "trainer") -> dict[str, dict[str, Any]]:
    status = sim.store.get("pods", name)["status"]
    return {str(c["type"]): c for c in status.get("conditions") or ()}


def ready(sim: SimApiServer) -> tuple[str, str | None, str | None]:
    found = conditions(sim).get("Ready") or {}
    return (found.get("status", ""), found.get("reason"), found.get("message"))


async def set_gate(core: k8s.CoreV1Api, status: str) -> None:
    """A controller's write: a strategic merge patch of pods/status, conditions by type."""
    condition = {"type": GATE, "status": status, "reason": "ServerReachable"}
    await core.patch_namespaced_pod_status(
        "trainer", "default", {"status": {"conditions": [condition]}}
    )


async def test_ready_waits_for_the_gate_condition_and_follows_it_both_ways(
    sim: SimApiServer, kubelet: Start, core: k8s.CoreV1Api, pod: Manifest
) -> None:
    sim.store.create("pods", gated_pod(pod))
    sim.store.bind("trainer", "client-1")
    async with kubelet():
        await eventually(lambda: sim.store.get("pods", "trainer")["status"]["phase"] == "Running")
        await eventually(lambda: ready(sim)[0] == "False")
        assert ready(sim) == (
            "False",
            "ReadinessGatesNotReady",
            f'corresponding condition of pod readiness gate "{GATE}" does not exist.',
        )
        assert conditions(sim)["ContainersReady"]["status"] == "True"
        await set_gate(core, "True")
        await eventually(lambda: ready(sim) == ("True", None, None))
        await set_gate(core, "False")
        await eventually(lambda: ready(sim)[0] == "False")
        why = f'the status of pod readiness gate "{GATE}" is not "True", but False'
        assert ready(sim)[2] == why
    assert conditions(sim)[GATE]["status"] == "False"
    assert conditions(sim)[GATE]["reason"] == "ServerReachable"


async def test_a_gate_condition_written_before_the_pod_starts_survives_the_kubelets_writes(
    sim: SimApiServer, kubelet: Start, core: k8s.CoreV1Api, pod: Manifest
) -> None:
    sim.store.create("pods", gated_pod(pod, run_seconds="0.2"))
    sim.store.bind("trainer", "client-1")
    await set_gate(core, "True")
    async with kubelet(start_delay_seconds=0.05):
        await eventually(lambda: ready(sim) == ("True", None, None))
        await eventually(lambda: sim.store.get("pods", "trainer")["status"]["phase"] == "Succeeded")
    final = conditions(sim)
    assert final[GATE]["status"] == "True"
    assert (final["Ready"]["status"], final["Ready"]["reason"]) == ("False", "PodCompleted")


async def test_a_pod_without_gates_is_ready_as_soon_as_its_containers_are(
    sim: SimApiServer, kubelet: Start, pod: Manifest
) -> None:
    sim.store.create("pods", pod("web", metadata={"annotations": {RUN_SECONDS_ANNOTATION: "60"}}))
    sim.store.bind("web", "client-1")
    async with kubelet():
        await eventually(lambda: conditions(sim, "web").get("Ready", {}).get("status") == "True")
    assert "reason" not in conditions(sim, "web")["Ready"]


async def test_readiness_gate_condition_types_must_be_qualified_names(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    body = pod("trainer")
    body["spec"]["readinessGates"] = [{"conditionType": "not valid!"}]
    response = await client.post("/api/v1/namespaces/default/pods", json=body)
    assert response.status_code == 422
    [cause] = response.json()["details"]["causes"]
    assert cause["field"] == "spec.readinessGates[0].conditionType"
