"""Workload planner: deterministic pods asking for remote GPUs the way users do."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from rgpu_kubesim._lupine_errors import SimOptionError
from rgpu_kubesim.fleet import ANNOTATION_RUN_SECONDS, WorkloadSpec, plan_workload

COUNT = "nvidia.com/remote-gpu"
MEMORY = "nvidia.com/remote-gpu-memory"


def gpu_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["spec"]["containers"] if COUNT in c["resources"].get("limits", {})]


def test_same_spec_plans_the_same_pods() -> None:
    spec = WorkloadSpec(pods=30, seed=8, namespaces=("a", "b"), multi_container_share=0.5)
    assert plan_workload(spec) == plan_workload(WorkloadSpec(**_fields(spec)))


def _fields(spec: WorkloadSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


def test_different_seeds_plan_different_streams() -> None:
    one = plan_workload(WorkloadSpec(pods=10, seed=1))
    two = plan_workload(WorkloadSpec(pods=10, seed=2))
    assert [p.arrival_seconds for p in one] != [p.arrival_seconds for p in two]


def test_gpu_containers_ask_equal_requests_and_limits_within_max_cards() -> None:
    pods = [p.manifest() for p in plan_workload(WorkloadSpec(pods=50, seed=3, max_cards=3))]
    containers = [c for pod in pods for c in gpu_containers(pod)]
    assert containers
    assert all(c["resources"]["limits"] == c["resources"]["requests"] for c in containers)
    assert {int(c["resources"]["limits"][COUNT]) for c in containers} == {1, 2, 3}


def test_resource_names_are_parameters() -> None:
    spec = WorkloadSpec(
        pods=5,
        resource_count="example.com/rgpu",
        resource_memory="example.com/rgpu-mem",
        memory_share=1.0,
    )
    limits = plan_workload(spec)[0].manifest()["spec"]["containers"][0]["resources"]["limits"]
    assert set(limits) == {"example.com/rgpu", "example.com/rgpu-mem"}


def test_scheduler_name_is_left_unset_by_default_for_the_webhook() -> None:
    pod = plan_workload(WorkloadSpec(pods=1))[0].manifest()
    assert "schedulerName" not in pod["spec"]


def test_scheduler_name_is_set_when_given() -> None:
    pod = plan_workload(WorkloadSpec(pods=1, scheduler_name="rgpu-scheduler"))[0].manifest()
    assert pod["spec"]["schedulerName"] == "rgpu-scheduler"


def test_run_seconds_annotation_matches_the_plan_and_range() -> None:
    plans = plan_workload(WorkloadSpec(pods=40, seed=4, run_seconds=(2.0, 3.0)))
    for plan in plans:
        annotation = plan.manifest()["metadata"]["annotations"][ANNOTATION_RUN_SECONDS]
        assert float(annotation) == plan.run_seconds
        assert 2.0 <= plan.run_seconds <= 3.0


def test_arrivals_are_in_order_and_spread_by_the_mean_gap() -> None:
    plans = plan_workload(WorkloadSpec(pods=400, seed=5, mean_gap_seconds=0.5))
    arrivals = [p.arrival_seconds for p in plans]
    assert arrivals == sorted(arrivals)
    assert 0.4 < arrivals[-1] / len(arrivals) < 0.6


def test_zero_mean_gap_submits_everything_at_once() -> None:
    plans = plan_workload(WorkloadSpec(pods=5, mean_gap_seconds=0.0))
    assert {p.arrival_seconds for p in plans} == {0.0}


def test_multi_container_pods_mix_gpu_workers_and_gpu_less_sidecars() -> None:
    plans = plan_workload(WorkloadSpec(pods=40, seed=6, multi_container_share=1.0))
    assert all(len(p.containers) == 2 for p in plans)
    seconds = {p.containers[1].cards > 0 for p in plans}
    assert seconds == {True, False}


def test_memory_share_controls_memory_requests() -> None:
    without = plan_workload(WorkloadSpec(pods=20, memory_share=0.0))
    assert all(c.memory_mib is None for p in without for c in p.containers)
    spec = WorkloadSpec(pods=20, memory_share=1.0, memory_mib_choices=(1000, 2000))
    with_memory = plan_workload(spec)
    assert {c.memory_mib for p in with_memory for c in p.containers if c.cards} <= {1000, 2000}


def test_pods_are_spread_over_the_given_namespaces() -> None:
    plans = plan_workload(WorkloadSpec(pods=30, seed=7, namespaces=("team-a", "team-b")))
    assert {p.namespace for p in plans} == {"team-a", "team-b"}
    assert all(p.manifest()["metadata"]["namespace"] == p.namespace for p in plans)


def test_manifests_are_valid_pods_and_fresh_on_each_call() -> None:
    spec = WorkloadSpec(pods=10, seed=8, multi_container_share=0.5, scheduler_name="s")
    for plan in plan_workload(spec):
        manifest = plan.manifest()
        kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), strict=True)
        manifest["metadata"]["name"] = "changed"
        assert plan.manifest()["metadata"]["name"] == plan.name


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pods", -1),
        ("max_cards", 0),
        ("memory_share", 2.0),
        ("resource_count", "remote-gpu"),
        ("namespaces", ("Bad_NS",)),
        ("scheduler_name", ""),
        ("run_seconds", (5.0, 1.0)),
        ("mean_gap_seconds", -1.0),
        ("memory_mib_choices", ()),
    ],
)
def test_bad_workload_spec_names_the_field(field: str, value: object) -> None:
    with pytest.raises(SimOptionError) as caught:
        WorkloadSpec(**{field: value})  # type: ignore[arg-type]
    assert caught.value.field == field
