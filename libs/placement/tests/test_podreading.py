"""Reading a raw pod's remote-GPU asks: limits then requests, whole numbers only."""

from __future__ import annotations

from typing import Any

import pytest

from rgpu_contracts import ContainerKind
from rgpu_placement import MAX_QUANTITY, InvalidQuantity, PodDemand, read_demand

COUNT = "nvidia.com/remote-gpu"
MEMORY = "nvidia.com/remote-gpu-memory"


def demand_of(the_pod: dict[str, Any]) -> PodDemand:
    return read_demand(the_pod, count_resource=COUNT, memory_resource=MEMORY)


def test_containers_are_listed_init_first_with_sidecars_and_empty_asks_kept(build) -> None:
    the_pod = build.pod(
        build.container("app-a", count="2", memory="4000"),
        build.container("logger"),
        init=[
            build.container("setup", count="1"),
            build.container("proxy", restartPolicy="Always"),
        ],
    )
    requests = demand_of(the_pod).requests()
    assert [(r.name, r.kind, r.count, r.memory_mib) for r in requests] == [
        ("setup", ContainerKind.INIT, 1, 0),
        ("proxy", ContainerKind.SIDECAR, 0, 0),
        ("app-a", ContainerKind.APP, 2, 4000),
        ("logger", ContainerKind.APP, 0, 0),
    ]


def test_limits_win_over_requests_and_requests_alone_count(build) -> None:
    both = build.container("a")
    both["resources"] = {"limits": {COUNT: "2"}, "requests": {COUNT: "1"}}
    only_requests = build.container("b")
    only_requests["resources"] = {"requests": {COUNT: "3"}}
    counts = [c.count for c in demand_of(build.pod(both, only_requests)).containers]
    assert counts == [2, 3]


def test_pod_without_the_resource_asks_for_nothing(build) -> None:
    demand = demand_of(build.pod(build.container("web"), build.container("zero", count="0")))
    assert not demand.asks
    assert demand.requesting == ()


def test_json_integer_quantity_is_accepted(build) -> None:
    assert demand_of(build.pod(build.container(count=2))).containers[0].count == 2


def test_maximum_quantity_is_accepted(build) -> None:
    the_pod = build.pod(build.container(count=str(MAX_QUANTITY)))
    assert demand_of(the_pod).containers[0].count == MAX_QUANTITY


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("1.5", "is not a whole number"),
        ("-1", "is negative"),
        ("2Gi", "is not a whole number"),
        ("1e3", "is not a whole number"),
        (str(2**31), "is larger than 2147483647"),
        ("", "is not a whole number"),
        (" 1", "is not a whole number"),
        (1.0, "is not a whole number"),
        (True, "is not a whole number"),
    ],
)
def test_invalid_count_names_container_and_value(build, value: object, problem: str) -> None:
    with pytest.raises(InvalidQuantity) as caught:
        demand_of(build.pod(build.container("trainer", count=value)))
    assert 'container "trainer"' in caught.value.message
    assert problem in caught.value.message
    assert caught.value.container == "trainer"
    assert caught.value.resource == COUNT


@pytest.mark.parametrize(
    "value",
    ["9" * 5000, "1" + "0" * 100_000, 10**5000, -(10**5000), "0" * 5000 + "1" * 11],
    ids=["5000-nines", "a-googol-and-more", "huge-int", "huge-negative-int", "zeros-then-11"],
)
def test_a_quantity_of_thousands_of_digits_is_refused_as_too_large(build, value: object) -> None:
    with pytest.raises(InvalidQuantity) as caught:
        demand_of(build.pod(build.container("trainer", count=value)))
    assert "is larger than 2147483647" in caught.value.message or "negative" in caught.value.message
    assert len(caught.value.message) < 400


def test_leading_zeros_do_not_count_as_digits(build) -> None:
    the_pod = build.pod(build.container(count="0" * 5000 + "2"))
    assert demand_of(the_pod).containers[0].count == 2


@pytest.mark.parametrize("value", [[1], {"n": 1}])
def test_a_quantity_that_is_not_a_scalar_is_not_a_whole_number(build, value: object) -> None:
    the_pod = build.pod(build.container("trainer", count=value))
    with pytest.raises(InvalidQuantity, match="is not a whole number"):
        demand_of(the_pod)


def test_invalid_memory_is_refused_with_a_mib_hint(build) -> None:
    with pytest.raises(InvalidQuantity, match="MiB per card") as caught:
        demand_of(build.pod(build.container(count="1", memory="40Gi")))
    assert caught.value.resource == MEMORY
    assert caught.value.value == "40Gi"


def test_memory_without_count_is_refused_not_ignored(build) -> None:
    with pytest.raises(InvalidQuantity, match=f'add {COUNT}: "1"'):
        demand_of(build.pod(build.container("main", memory="4000")))


def test_invalid_quantity_in_an_init_container_is_refused(build) -> None:
    with pytest.raises(InvalidQuantity, match='container "setup"'):
        demand_of(build.pod(build.container(), init=[build.container("setup", count="0.5")]))


def test_the_cuda_major_label_is_read_with_the_demand(build) -> None:
    pod = build.pod()
    pod["metadata"]["labels"] = {"rgpu.io/cuda-major": "12"}
    demand = read_demand(pod, count_resource=COUNT, memory_resource=MEMORY)
    assert demand.cuda_major == 12
    assert read_demand(build.pod(), count_resource=COUNT, memory_resource=MEMORY).cuda_major is None


@pytest.mark.parametrize("value", ["twelve", "12.4", "-1", "1000", "", ["12"]])
def test_an_unreadable_cuda_major_label_is_refused_naming_the_label(build, value) -> None:
    pod = build.pod()
    pod["metadata"]["labels"] = {"rgpu.io/cuda-major": value}
    with pytest.raises(InvalidQuantity, match=r"rgpu\.io/cuda-major") as caught:
        read_demand(pod, count_resource=COUNT, memory_resource=MEMORY)
    assert caught.value.resource == "rgpu.io/cuda-major"
