"""The kubelet emulator against the simulated apiserver over HTTP and real fake lupine servers."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest

from rgpu_kubesim import LupineFleet, LupineSpec, SimApiServer, SimOptionError, open_lupine_fleet
from rgpu_kubesim.kubelet import (
    ENV_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    KubeletConfig,
    KubeletEmulator,
    RunRecord,
    resolve_env,
)
from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio

GPU = "nvidia.com/remote-gpu"
ENDPOINT = "hami.io/lupine-endpoint"
VISIBLE = "rgpu.io/visible-devices"
FAST: dict[str, Any] = {
    "start_delay_seconds": 0.02,
    "default_run_seconds": 0.1,
    "retry_initial_seconds": 0.02,
    "retry_max_seconds": 0.1,
}


@pytest.fixture
async def lupines() -> AsyncIterator[LupineFleet]:
    async with open_lupine_fleet() as fleet:
        await fleet.start(LupineSpec(name="gpu-a", gpus=("GPU-a0", "GPU-a1")))
        await fleet.start(LupineSpec(name="gpu-b", gpus=("GPU-b0",)))
        yield fleet


Start = Callable[..., contextlib.AbstractAsyncContextManager[KubeletEmulator]]


@pytest.fixture
def kubelet(client: httpx.AsyncClient, lupines: LupineFleet) -> Start:
    """start(**config) -> async context manager running a KubeletEmulator."""

    @contextlib.asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[KubeletEmulator]:
        emulator = KubeletEmulator(KubeletConfig(**{**FAST, **overrides}), client, lupines.get)
        async with anyio.create_task_group() as tg:
            await tg.start(emulator.run)
            yield emulator
            tg.cancel_scope.cancel()

    return start


def field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


WIRED = [
    field_env("LUPINE_SERVER", f"metadata.annotations['{ENDPOINT}']"),
    field_env("LUPINE_WORKLOAD_ID", "metadata.uid"),
]


def gpu_pod(
    name: str,
    *,
    env: list[dict[str, Any]] | None = None,
    resources: dict[str, Any] | None = None,
    run_seconds: str | None = None,
) -> dict[str, Any]:
    annotations = {} if run_seconds is None else {RUN_SECONDS_ANNOTATION: run_seconds}
    container = {
        "name": "main",
        "image": "registry.local/cuda-app:1",
        "env": WIRED if env is None else env,
        "resources": {"limits": {GPU: "1"}} if resources is None else resources,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }


def start_pod(
    sim: SimApiServer, manifest: dict[str, Any], annotations: dict[str, str] | None = None
) -> str:
    """Create the pod and bind it the way the extender does (annotations in the binding)."""
    uid = str(sim.store.create("pods", manifest)["metadata"]["uid"])
    sim.store.bind(manifest["metadata"]["name"], "client-1", annotations=annotations or {})
    return uid


def pod_status(sim: SimApiServer, name: str) -> dict[str, Any]:
    status: dict[str, Any] = sim.store.get("pods", name, namespace="default")["status"]
    return status


def phase(sim: SimApiServer, name: str) -> str:
    return str(pod_status(sim, name).get("phase"))


def endpoint_of(lupines: LupineFleet, name: str) -> str:
    return lupines.by_name(name).endpoint


async def test_env_is_resolved_from_the_annotations_as_they_are_at_start(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    first, second = endpoint_of(lupines, "gpu-a"), endpoint_of(lupines, "gpu-b")
    async with kubelet(start_delay_seconds=0.3) as emulator:
        uid = start_pod(sim, gpu_pod("trainer", run_seconds="5"), {ENDPOINT: first})
        patch = {"metadata": {"annotations": {ENDPOINT: second}}}
        sim.store.patch("pods", "trainer", patch, namespace="default")
        await eventually(lambda: phase(sim, "trainer") == "Running")
        record = emulator.records[uid]
        annotations = sim.store.get("pods", "trainer", namespace="default")["metadata"]
    assert record.env == {"main": {"LUPINE_SERVER": second, "LUPINE_WORKLOAD_ID": uid}}
    assert record.endpoint == second
    assert json.loads(annotations["annotations"][ENV_ANNOTATION]) == record.env


async def test_an_empty_lupine_server_fails_the_pod_without_connecting(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    async with kubelet() as emulator:
        uid = start_pod(sim, gpu_pod("trainer"))
        await eventually(lambda: phase(sim, "trainer") == "Failed")
    status = pod_status(sim, "trainer")
    assert status["message"] == "LUPINE_SERVER resolved empty in container(s) main"
    assert emulator.records[uid].phase == "Failed"
    assert emulator.records[uid].env["main"]["LUPINE_SERVER"] == ""
    assert all(not server.clients for server in lupines)


async def test_a_running_pod_is_a_client_of_its_lupine_server_until_it_succeeds(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    server = lupines.by_name("gpu-a")
    async with kubelet() as emulator:
        uid = start_pod(sim, gpu_pod("trainer", run_seconds="0.4"), {ENDPOINT: server.endpoint})
        await eventually(lambda: phase(sim, "trainer") == "Running")
        assert server.clients[uid].gpu_uuids == ("GPU-a0", "GPU-a1")
        assert 'device_uuid="GPU-a0"' in server.metrics_text()
        await eventually(lambda: phase(sim, "trainer") == "Succeeded")
    record = emulator.records[uid]
    assert not server.clients
    assert "lupine_client_device_memory_used_bytes{" not in server.metrics_text()
    assert record.phase == "Succeeded" and record.gpus == ("GPU-a0", "GPU-a1")
    assert record.finished_at is not None and record.finished_at - record.started_at >= 0.4


async def test_run_time_defaults_when_the_annotation_is_missing_or_invalid(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    endpoint = {ENDPOINT: endpoint_of(lupines, "gpu-a")}
    async with kubelet(default_run_seconds=0.2) as emulator:
        uids = [
            start_pod(sim, gpu_pod("missing"), endpoint),
            start_pod(sim, gpu_pod("words", run_seconds="soon"), endpoint),
            start_pod(sim, gpu_pod("negative", run_seconds="-3"), endpoint),
        ]
        await eventually(
            lambda: (
                all(u in emulator.records for u in uids)
                and all(emulator.records[u].phase == "Succeeded" for u in uids)
            )
        )
    for uid in uids:
        record = emulator.records[uid]
        assert record.finished_at is not None and record.finished_at - record.started_at >= 0.2


async def test_a_pod_force_deleted_while_running_leaves_its_lupine_server_at_once(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    server = lupines.by_name("gpu-a")
    async with kubelet() as emulator:
        uid = start_pod(sim, gpu_pod("trainer", run_seconds="30"), {ENDPOINT: server.endpoint})
        await eventually(lambda: uid in server.clients)
        sim.store.delete("pods", "trainer", namespace="default", grace_period_seconds=0)
        await eventually(lambda: not server.clients, timeout=2)
        await anyio.sleep(0.1)
    record = emulator.records[uid]
    assert record.deleted and record.phase == "Running" and record.finished_at is not None


async def test_a_pod_deleted_before_it_starts_never_runs(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    server = lupines.by_name("gpu-a")
    async with kubelet(start_delay_seconds=0.2) as emulator:
        uid = start_pod(sim, gpu_pod("trainer"), {ENDPOINT: server.endpoint})
        await anyio.sleep(0.05)
        sim.store.delete("pods", "trainer", namespace="default")
        await anyio.sleep(0.3)
    assert uid not in emulator.records
    assert not server.clients


async def test_visible_devices_limit_the_gpus_a_pod_holds(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    server = lupines.by_name("gpu-a")
    env = [*WIRED, field_env("CUDA_VISIBLE_DEVICES", f"metadata.annotations['{VISIBLE}']")]
    annotations = {ENDPOINT: server.endpoint, VISIBLE: "GPU-a1"}
    async with kubelet():
        uid = start_pod(sim, gpu_pod("trainer", env=env, run_seconds="5"), annotations)
        await eventually(lambda: uid in server.clients)
        assert server.clients[uid].gpu_uuids == ("GPU-a1",)


async def test_memory_per_card_is_what_the_client_holds_on_each_gpu(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    server = lupines.by_name("gpu-a")
    resources = {"limits": {GPU: "1", "nvidia.com/remote-gpu-memory": "2048"}}
    manifest = gpu_pod("trainer", resources=resources, run_seconds="5")
    async with kubelet():
        uid = start_pod(sim, manifest, {ENDPOINT: server.endpoint})
        await eventually(lambda: uid in server.clients)
        assert server.clients[uid].memory_bytes == 2048 << 20


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({ENDPOINT: "127.0.0.1:1"}, "cannot connect to lupine at 127.0.0.1:1"),
        ({ENDPOINT: "gpu-a", VISIBLE: "GPU-zz"}, "names GPUs the server does not have"),
    ],
)
async def test_a_pod_that_cannot_use_its_server_fails(
    sim: SimApiServer,
    lupines: LupineFleet,
    kubelet: Start,
    annotations: dict[str, str],
    message: str,
) -> None:
    if annotations[ENDPOINT] == "gpu-a":
        annotations = {**annotations, ENDPOINT: endpoint_of(lupines, "gpu-a")}
    env = [*WIRED, field_env("CUDA_VISIBLE_DEVICES", f"metadata.annotations['{VISIBLE}']")]
    async with kubelet():
        start_pod(sim, gpu_pod("trainer", env=env), annotations)
        await eventually(lambda: phase(sim, "trainer") == "Failed")
    assert message in pod_status(sim, "trainer")["message"]
    assert all(not server.clients for server in lupines)


async def test_a_server_that_is_down_fails_the_pod(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    server = lupines.by_name("gpu-b")
    await server.set_fault("down")
    async with kubelet() as emulator:
        uid = start_pod(sim, gpu_pod("trainer"), {ENDPOINT: server.endpoint})
        await eventually(lambda: phase(sim, "trainer") == "Failed")
    assert emulator.records[uid].endpoint == server.endpoint


async def test_a_pod_without_remote_gpus_runs_without_a_lupine_client(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    async with kubelet() as emulator:
        uid = start_pod(sim, gpu_pod("web", env=[], resources={}))
        await eventually(lambda: phase(sim, "web") == "Succeeded")
    record = emulator.records[uid]
    assert (record.endpoint, record.gpus, record.phase) == ("", (), "Succeeded")


async def test_pending_pods_are_not_started(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    async with kubelet() as emulator:
        sim.store.create("pods", gpu_pod("waiting"))
        await anyio.sleep(0.2)
    assert emulator.records == {}
    assert phase(sim, "waiting") == "Pending"


async def test_status_writes_are_retried_while_the_apiserver_fails(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    server = lupines.by_name("gpu-a")
    sim.faults.set_error(verb="patch", resource="pods", rate=0.6, code=500)
    sim.faults.set_error(verb="get", resource="pods", rate=0.6, code=503)
    async with kubelet() as emulator:
        uid = start_pod(sim, gpu_pod("trainer"), {ENDPOINT: server.endpoint})
        await eventually(lambda: phase(sim, "trainer") == "Succeeded")
    assert emulator.records[uid].phase == "Succeeded"
    assert not server.clients


async def test_cut_watches_and_expired_versions_do_not_lose_or_rerun_pods(
    sim: SimApiServer, lupines: LupineFleet, kubelet: Start
) -> None:
    endpoint = {ENDPOINT: endpoint_of(lupines, "gpu-a")}
    async with kubelet() as emulator:
        first = start_pod(sim, gpu_pod("first"), endpoint)
        await eventually(lambda: phase(sim, "first") == "Succeeded")
        sim.faults.expire_before()
        sim.faults.cut_watches()
        second = start_pod(sim, gpu_pod("second"), endpoint)
        await eventually(lambda: phase(sim, "second") == "Succeeded")
        await anyio.sleep(0.1)
    assert sorted(emulator.records) == sorted([first, second])
    assert all(r.phase == "Succeeded" for r in emulator.records.values())


def test_env_literals_expand_earlier_variables_and_escape_double_dollars() -> None:
    pod = {
        "metadata": {"uid": "u-1", "name": "p", "namespace": "ml", "annotations": {}},
        "spec": {
            "nodeName": "client-1",
            "initContainers": [{"name": "init", "env": [{"name": "A", "value": "x"}]}],
            "containers": [
                {
                    "name": "main",
                    "env": [
                        field_env("ID", "metadata.uid"),
                        field_env("NODE", "spec.nodeName"),
                        field_env("MISSING", "metadata.labels['team']"),
                        {"name": "TAG", "value": "$(ID)-$(NODE)-$(UNDEFINED)-$$(ID)"},
                        {"name": "EMPTY"},
                    ],
                }
            ],
        },
    }
    assert resolve_env(pod) == {
        "init": {"A": "x"},
        "main": {
            "ID": "u-1",
            "NODE": "client-1",
            "MISSING": "",
            "TAG": "u-1-client-1-$(UNDEFINED)-$(ID)",
            "EMPTY": "",
        },
    }


def test_run_records_are_immutable() -> None:
    record = RunRecord(
        uid="u", key="ns/p", node="n", env={}, endpoint="", gpus=(), annotations={}, started_at=0
    )
    with pytest.raises(AttributeError):
        record.phase = "Failed"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "field_name"),
    [
        ({"start_delay_seconds": -1}, "start_delay_seconds"),
        ({"default_run_seconds": float("nan")}, "default_run_seconds"),
        ({"retry_initial_seconds": 0}, "retry_initial_seconds"),
        ({"count_resource": ""}, "count_resource"),
    ],
)
def test_invalid_kubelet_config_names_the_field(overrides: dict[str, Any], field_name: str) -> None:
    with pytest.raises(SimOptionError) as caught:
        KubeletConfig(**overrides)
    assert caught.value.field == field_name


async def test_running_pod_has_a_kubelets_status_with_addresses_and_ready_containers(
    sim: SimApiServer, kubelet: Start
) -> None:
    sim.store.create(
        "nodes",
        {
            "metadata": {"name": "client-1"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.7"}]},
        },
    )
    plain = gpu_pod("plain", env=[], resources={}, run_seconds="30")
    second = gpu_pod("second", env=[], resources={}, run_seconds="30")
    async with kubelet():
        start_pod(sim, plain)
        start_pod(sim, second)
        await eventually(lambda: phase(sim, "plain") == phase(sim, "second") == "Running")
        status, other = pod_status(sim, "plain"), pod_status(sim, "second")
    assert status["hostIP"] == "192.0.2.7" and status["hostIPs"] == [{"ip": "192.0.2.7"}]
    # Each pod its own loopback address (its connections really come from it).
    assert status["podIP"].startswith("127.") and status["podIPs"] == [{"ip": status["podIP"]}]
    assert {status["podIP"], other["podIP"]} == {"127.130.0.2", "127.130.0.3"}
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    (container,) = status["containerStatuses"]
    assert container["name"] == "main" and container["ready"] and container["started"]
    assert container["state"]["running"]["startedAt"] == status["startTime"]
    assert container["containerID"].startswith("containerd://")


async def test_finished_pod_reports_terminated_containers_with_exit_codes(
    sim: SimApiServer, kubelet: Start
) -> None:
    async with kubelet():
        start_pod(sim, gpu_pod("done", env=[], resources={}, run_seconds="0"))
        start_pod(sim, gpu_pod("broken", env=[]))
        await eventually(lambda: phase(sim, "done") == "Succeeded")
        await eventually(lambda: phase(sim, "broken") == "Failed")
    done = pod_status(sim, "done")["containerStatuses"][0]
    assert done["state"]["terminated"]["exitCode"] == 0
    assert done["state"]["terminated"]["reason"] == "Completed" and not done["ready"]
    broken = pod_status(sim, "broken")
    assert broken["reason"] == "RemoteGPUUnavailable"
    terminated = broken["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 1 and terminated["reason"] == "Error"
    ready = next(c for c in broken["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodFailed")
