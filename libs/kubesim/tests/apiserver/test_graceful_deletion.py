"""Graceful pod deletion over HTTP: the apiserver marks, the kubelet emulator stops and deletes."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest
from kubernetes_asyncio import client as k8s

from rgpu_kubesim import LupineFleet, LupineSpec, SimApiServer, open_lupine_fleet
from rgpu_kubesim.kubelet import RUN_SECONDS_ANNOTATION, KubeletConfig, KubeletEmulator

pytestmark = pytest.mark.anyio

Manifest = Callable[..., dict[str, Any]]
PATH = "/api/v1/namespaces/default/pods"
ENDPOINT = "hami.io/lupine-endpoint"
FAST: dict[str, Any] = {
    "start_delay_seconds": 0.01,
    "retry_initial_seconds": 0.02,
    "retry_max_seconds": 0.1,
}
Start = Callable[..., contextlib.AbstractAsyncContextManager[KubeletEmulator]]


@pytest.fixture
async def lupines() -> AsyncIterator[LupineFleet]:
    async with open_lupine_fleet() as fleet:
        await fleet.start(LupineSpec(name="gpu-a", gpus=("GPU-a0",)))
        yield fleet


@pytest.fixture
def kubelet(client: httpx.AsyncClient, lupines: LupineFleet) -> Start:
    @contextlib.asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[KubeletEmulator]:
        emulator = KubeletEmulator(KubeletConfig(**{**FAST, **overrides}), client, lupines.get)
        async with anyio.create_task_group() as tg:
            await tg.start(emulator.run)
            yield emulator
            tg.cancel_scope.cancel()

    return start


def bound(sim: SimApiServer, pod: Manifest, name: str, **spec: Any) -> str:
    manifest = pod(name)
    manifest["spec"].update(spec)
    uid = str(sim.store.create("pods", manifest)["metadata"]["uid"])
    sim.store.bind(name, "node-a")
    return uid


def gpu_pod(sim: SimApiServer, lupines: LupineFleet, name: str, run: str, grace: int) -> str:
    env = [
        {
            "name": "LUPINE_SERVER",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{ENDPOINT}']"}},
        }
    ]
    container = {
        "name": "main",
        "image": "registry.local/cuda-app:1",
        "env": env,
        "resources": {"limits": {"nvidia.com/remote-gpu": "1"}},
    }
    manifest = {
        "metadata": {"name": name, "annotations": {RUN_SECONDS_ANNOTATION: run}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "containers": [container],
        },
    }
    uid = str(sim.store.create("pods", manifest, namespace="default")["metadata"]["uid"])
    endpoint = lupines.by_name("gpu-a").endpoint
    sim.store.bind(name, "node-a", annotations={ENDPOINT: endpoint})
    return uid


def seconds(stamp: str) -> float:
    parsed = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
    return parsed.replace(tzinfo=datetime.UTC).timestamp()


def phase(sim: SimApiServer, name: str) -> str:
    return str(sim.store.get("pods", name, namespace="default")["status"].get("phase"))


def names(sim: SimApiServer) -> list[str]:
    return [p["metadata"]["name"] for p in sim.store.list("pods")]


async def eventually(check: Callable[[], object], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.01)


# -- the apiserver's part ------------------------------------------------------------------


async def test_deleting_a_bound_pod_marks_it_with_the_default_grace_of_30_seconds(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    bound(sim, pod, "a")
    response = await client.delete(f"{PATH}/a")
    assert response.status_code == 200
    meta = response.json()["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 30
    created = seconds(meta["creationTimestamp"])
    assert 29 <= seconds(meta["deletionTimestamp"]) - created <= 31
    stored = (await client.get(f"{PATH}/a")).json()["metadata"]
    assert stored["deletionTimestamp"] == meta["deletionTimestamp"]


async def test_the_pods_termination_grace_period_is_the_default(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    bound(sim, pod, "a", terminationGracePeriodSeconds=7)
    response = await client.delete(f"{PATH}/a")
    assert response.json()["metadata"]["deletionGracePeriodSeconds"] == 7


@pytest.mark.parametrize("where", ["body", "query"])
async def test_the_requested_grace_period_overrides_the_pods(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest, where: str
) -> None:
    bound(sim, pod, "a")
    if where == "body":
        body = b'{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":12}'
        response = await client.request("DELETE", f"{PATH}/a", content=body)
    else:
        response = await client.delete(f"{PATH}/a", params={"gracePeriodSeconds": "12"})
    assert response.json()["metadata"]["deletionGracePeriodSeconds"] == 12


async def test_a_grace_period_of_zero_deletes_at_once_with_kubernetes_asyncio(
    sim: SimApiServer, pod: Manifest
) -> None:
    bound(sim, pod, "a")
    async with k8s.ApiClient(k8s.Configuration(host=sim.url)) as api:
        core = k8s.CoreV1Api(api)
        options = k8s.V1DeleteOptions(grace_period_seconds=0)
        await core.delete_namespaced_pod("a", "default", body=options)
    assert names(sim) == []


async def test_a_second_delete_may_shorten_the_grace_but_never_lengthen_it(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    bound(sim, pod, "a")
    first = await client.delete(f"{PATH}/a")
    longer = await client.delete(f"{PATH}/a", params={"gracePeriodSeconds": "60"})
    assert longer.status_code == 200
    assert longer.json()["metadata"] == first.json()["metadata"]
    shorter = (await client.delete(f"{PATH}/a", params={"gracePeriodSeconds": "5"})).json()
    assert shorter["metadata"]["deletionGracePeriodSeconds"] == 5
    moved = seconds(first.json()["metadata"]["deletionTimestamp"])
    assert moved - seconds(shorter["metadata"]["deletionTimestamp"]) == 25
    await client.delete(f"{PATH}/a", params={"gracePeriodSeconds": "0"})
    assert names(sim) == []


async def test_unbound_and_finished_pods_are_deleted_at_once(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    sim.store.create("pods", pod("pending"))
    bound(sim, pod, "done")
    sim.store.patch("pods", "done", {"status": {"phase": "Succeeded"}}, subresource="status")
    for name in ("pending", "done"):
        assert (await client.delete(f"{PATH}/{name}")).status_code == 200
    assert names(sim) == []


async def test_deleting_the_collection_marks_bound_pods_and_removes_unbound_ones(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    bound(sim, pod, "running")
    sim.store.create("pods", pod("pending"))
    response = await client.request(
        "DELETE", PATH, content=b'{"gracePeriodSeconds":9}', params={"labelSelector": ""}
    )
    assert response.status_code == 200
    assert names(sim) == ["running"]
    meta = sim.store.get("pods", "running", namespace="default")["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 9


async def test_a_graceful_delete_sends_modified_and_the_final_one_deleted(
    sim: SimApiServer, pod: Manifest
) -> None:
    bound(sim, pod, "a")
    version = str(sim.store.resource_version)
    sim.store.delete("pods", "a")
    sim.store.delete("pods", "a", grace_period_seconds=0)
    async with sim.store.watch("pods", resource_version=version) as events:
        seen = [await anext(events), await anext(events)]
    assert [e["type"] for e in seen] == ["MODIFIED", "DELETED"]
    assert seen[0]["object"]["metadata"]["deletionGracePeriodSeconds"] == 30


async def test_without_a_kubelet_a_terminating_pod_stays_until_force_deleted(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    bound(sim, pod, "a")
    await client.delete(f"{PATH}/a", params={"gracePeriodSeconds": "1"})
    assert names(sim) == ["a"]
    await client.delete(f"{PATH}/a", params={"gracePeriodSeconds": "0"})
    assert names(sim) == []


async def test_an_invalid_grace_period_is_a_400_naming_the_field(
    sim: SimApiServer, client: httpx.AsyncClient, pod: Manifest
) -> None:
    bound(sim, pod, "a")
    response = await client.delete(f"{PATH}/a", params={"gracePeriodSeconds": "soon"})
    assert response.status_code == 400
    assert "gracePeriodSeconds" in response.json()["message"]


# -- the kubelet's part --------------------------------------------------------------------


async def test_the_kubelet_kills_a_deleted_pod_writes_failed_137_then_deletes_it(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    server = lupines.by_name("gpu-a")
    async with kubelet(shutdown_seconds=0.05) as emulator:
        uid = gpu_pod(sim, lupines, "trainer", run="30", grace=30)
        await eventually(lambda: phase(sim, "trainer") == "Running")
        version = str(sim.store.resource_version)
        sim.store.delete("pods", "trainer", namespace="default")
        await eventually(lambda: names(sim) == [])
    async with sim.store.watch("pods", resource_version=version) as events:
        seen = [await anext(events) for _ in range(3)]
    assert [e["type"] for e in seen] == ["MODIFIED", "MODIFIED", "DELETED"]
    status = seen[1]["object"]["status"]
    assert status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    record = emulator.records[uid]
    assert (record.phase, record.exit_code, record.deleted) == ("Failed", 137, True)
    assert not server.clients


async def test_a_pod_finishing_within_its_shutdown_succeeds(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    async with kubelet(shutdown_seconds=20) as emulator:
        uid = gpu_pod(sim, lupines, "trainer", run="0.3", grace=30)
        await eventually(lambda: uid in lupines.by_name("gpu-a").clients)
        sim.store.delete("pods", "trainer", namespace="default")
        await eventually(lambda: names(sim) == [])
    record = emulator.records[uid]
    assert (record.phase, record.exit_code, record.deleted) == ("Succeeded", 0, False)


async def test_a_shortened_grace_kills_a_pod_still_shutting_down(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    async with kubelet(shutdown_seconds=20) as emulator:
        uid = gpu_pod(sim, lupines, "trainer", run="30", grace=30)
        await eventually(lambda: phase(sim, "trainer") == "Running")
        sim.store.delete("pods", "trainer", namespace="default")
        await eventually(lambda: emulator.records[uid].terminating_at is not None)
        sim.store.delete("pods", "trainer", namespace="default", grace_period_seconds=1)
        await eventually(lambda: names(sim) == [])
    record = emulator.records[uid]
    assert (record.phase, record.exit_code) == ("Failed", 137)


async def test_the_lupine_client_disconnects_after_the_shutdown_share_of_the_grace(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    server = lupines.by_name("gpu-a")
    async with kubelet(shutdown_fraction=0.2) as emulator:
        uid = gpu_pod(sim, lupines, "trainer", run="30", grace=1)
        await eventually(lambda: uid in server.clients)
        sim.store.delete("pods", "trainer", namespace="default")
        await eventually(lambda: emulator.records[uid].terminating_at is not None)
        assert uid in server.clients
        await eventually(lambda: names(sim) == [])
    record = emulator.records[uid]
    assert record.terminating_at is not None and record.finished_at is not None
    assert record.finished_at - record.terminating_at >= 0.2
    assert not server.clients


async def test_a_deleted_pod_the_kubelet_never_started_is_deleted_by_it(
    sim: SimApiServer, pod: Manifest, kubelet: Start
) -> None:
    bound(sim, pod, "a")
    sim.store.patch("pods", "a", {"status": {"phase": "Running"}}, subresource="status")
    sim.store.delete("pods", "a")
    async with kubelet() as emulator:
        await eventually(lambda: names(sim) == [])
    assert emulator.records == {}


def test_shutdown_defaults_to_a_tenth_of_the_grace_and_never_exceeds_it() -> None:
    assert KubeletConfig().shutdown_for(30) == pytest.approx(3.0)
    assert KubeletConfig(shutdown_seconds=50).shutdown_for(10) == 10
    assert KubeletConfig(shutdown_seconds=0.5).shutdown_for(10) == 0.5


@pytest.mark.parametrize(
    ("overrides", "field_name"),
    [
        ({"shutdown_seconds": -1}, "shutdown_seconds"),
        ({"shutdown_fraction": 2}, "shutdown_fraction"),
    ],
)
def test_invalid_shutdown_settings_name_the_field(
    overrides: dict[str, Any], field_name: str
) -> None:
    with pytest.raises(ValueError, match=field_name):
        KubeletConfig(**overrides)
