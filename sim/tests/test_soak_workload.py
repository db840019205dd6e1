"""The soak's pod stream: replayable from its seed, and as varied as it claims to be."""

from __future__ import annotations

from collections import Counter

from rgpu_sim.soak_workload import WorkloadShape, plan_soak_workload


def test_the_same_seed_plans_the_same_stream_and_another_seed_another() -> None:
    shape = WorkloadShape(pods=50, seed=7)
    assert plan_soak_workload(shape) == plan_soak_workload(shape)
    assert plan_soak_workload(shape) != plan_soak_workload(WorkloadShape(pods=50, seed=8))


def test_the_stream_has_every_fate_init_containers_memory_asks_and_several_containers() -> None:
    pods = plan_soak_workload(WorkloadShape(pods=400, seed=1))
    assert set(Counter(p.fate for p in pods)) == {"run", "delete-running", "delete-pending"}
    assert any(p.init_cards for p in pods)
    assert any(len(p.containers) > 1 for p in pods)
    assert any(memory for p in pods for _, _, memory in p.containers)
    arrivals = [p.arrival_seconds for p in pods]
    assert arrivals == sorted(arrivals)


def test_a_running_pod_is_deleted_before_its_run_time_ends() -> None:
    pods = plan_soak_workload(WorkloadShape(pods=400, seed=2))
    running = [p for p in pods if p.fate == "delete-running"]
    assert running
    assert all(p.delete_after_seconds < p.run_seconds for p in running)


def test_the_manifest_asks_for_remote_gpus_in_init_and_app_containers() -> None:
    pods = plan_soak_workload(WorkloadShape(pods=400, seed=3))
    pod = next(p for p in pods if p.init_cards and p.containers[0][2])
    manifest = pod.manifest()
    init = manifest["spec"]["initContainers"][0]["resources"]["limits"]
    main = manifest["spec"]["containers"][0]["resources"]["limits"]
    assert init["nvidia.com/remote-gpu"] == str(pod.init_cards)
    assert main["nvidia.com/remote-gpu-memory"] == str(pod.containers[0][2])
    assert manifest["metadata"]["annotations"]["sim.rgpu.io/run-seconds"] == f"{pod.run_seconds:g}"
