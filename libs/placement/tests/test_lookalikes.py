"""Resource names that look like rgpu's but are not: named with what was meant, while the
served names and unrelated resources (the node-local ``nvidia.com/gpu``) are left alone."""

from __future__ import annotations

import pytest

from rgpu_placement import Lookalike, lookalikes
from rgpu_testkit import container_manifest, pod_manifest

COUNT, MEMORY = "nvidia.com/remote-gpu", "nvidia.com/remote-gpu-memory"


def found(*limits: dict[str, str]) -> tuple[Lookalike, ...]:
    containers = [container_manifest(name=f"c{i}", limits=limit) for i, limit in enumerate(limits)]
    pod = pod_manifest(containers=containers)
    return lookalikes(pod, count_resource=COUNT, memory_resource=MEMORY)


@pytest.mark.parametrize(
    ("asked", "meant"),
    [
        ("nvidia.com/remote-gpus", COUNT),
        ("nvidia.com/Remote-GPU", COUNT),
        ("nvidia.com/remote_gpu", COUNT),
        ("nvidia.com/remotegpu", COUNT),
        ("hami.io/remote-gpu", COUNT),
        ("remote-gpu", COUNT),
        ("nvidia.com/remote-gpu-mem", MEMORY),
        ("nvidia.com/remote-gpu-memroy", MEMORY),
    ],
)
def test_a_slip_of_a_served_name_is_named_with_the_name_meant(asked: str, meant: str) -> None:
    (lookalike,) = found({asked: "1"})
    assert (lookalike.container, lookalike.resource, lookalike.meant) == ("c0", asked, meant)
    assert f"did you mean {meant}?" in lookalike.message


@pytest.mark.parametrize("asked", [COUNT, MEMORY, "nvidia.com/gpu", "cpu", "example.com/fpga"])
def test_served_and_unrelated_resources_are_not_lookalikes(asked: str) -> None:
    assert found({asked: "1"}) == ()


def test_each_container_and_both_limits_and_requests_are_read() -> None:
    pod = pod_manifest(
        containers=[
            container_manifest(name="a", limits={COUNT: "1"}),
            {"name": "b", "resources": {"requests": {"nvidia.com/remote-gpus": "1"}}},
        ],
    )
    (lookalike,) = lookalikes(pod, count_resource=COUNT, memory_resource=MEMORY)
    assert lookalike.container == "b"


def test_renamed_resources_are_judged_against_the_names_configured() -> None:
    asks = container_manifest(limits={"example.com/rgpus": "1"})
    pod = pod_manifest(containers=[asks])
    (lookalike,) = lookalikes(
        pod, count_resource="example.com/rgpu", memory_resource="example.com/rgpu-mem"
    )
    assert lookalike.meant == "example.com/rgpu"
