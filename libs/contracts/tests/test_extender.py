from __future__ import annotations

from collections.abc import Callable

import pytest

from rgpu_contracts import (
    ContractError,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
    decode_host_priorities,
    encode_host_priorities,
)

Load = Callable[[str], object]


def test_filter_args_fixture_decodes_and_reencodes_with_pascal_keys(load_fixture: Load) -> None:
    raw = load_fixture("k8s/extender-filter-args.json")
    args = ExtenderArgs.from_dict(raw)
    assert args.node_names == ("gpu-node-1", "gpu-node-2", "cpu-node-1")
    assert args.pod["metadata"]["name"] == "trainer-0"
    assert args.to_dict() == raw


def test_prioritize_args_fixture_roundtrips(load_fixture: Load) -> None:
    raw = load_fixture("k8s/extender-prioritize-args.json")
    assert ExtenderArgs.from_dict(raw).to_dict() == raw


@pytest.mark.parametrize(
    "name", ["k8s/extender-filter-result.json", "k8s/extender-filter-result-error.json"]
)
def test_filter_result_fixtures_roundtrip_with_every_field_present(
    load_fixture: Load, name: str
) -> None:
    raw = load_fixture(name)
    encoded = ExtenderFilterResult.from_dict(raw).to_dict()
    assert encoded == raw
    assert list(encoded) == [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    ]


def test_prioritize_result_fixture_roundtrips_as_bare_array(load_fixture: Load) -> None:
    raw = load_fixture("k8s/extender-prioritize-result.json")
    priorities = decode_host_priorities(raw)
    assert priorities[0] == HostPriority(host="gpu-node-1", score=10)
    assert encode_host_priorities(priorities) == raw


def test_bind_args_and_results_roundtrip(load_fixture: Load) -> None:
    raw = load_fixture("k8s/extender-bind-args.json")
    args = ExtenderBindingArgs.from_dict(raw)
    assert (args.pod_name, args.node) == ("trainer-0", "gpu-node-1")
    assert args.to_dict() == raw
    for name in ("k8s/extender-bind-result-ok.json", "k8s/extender-bind-result-error.json"):
        result = load_fixture(name)
        assert ExtenderBindingResult.from_dict(result).to_dict() == result


def test_keys_are_matched_case_insensitively_like_go() -> None:
    args = ExtenderArgs.from_dict({"pod": {"metadata": {}}, "nodenames": ["a"], "NODES": None})
    assert args.node_names == ("a",)
    bind = ExtenderBindingArgs.from_dict(
        {"podname": "p", "podnamespace": "n", "poduid": "u", "node": "x"}
    )
    assert bind.pod_uid == "u"


def test_full_nodes_list_gives_candidate_names() -> None:
    args = ExtenderArgs.from_dict(
        {"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}}
    )
    assert args.node_names is None
    assert args.candidate_names() == ("a", "b")


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({}, "Pod"),
        ({"Pod": {}, "NodeNames": "a"}, "NodeNames"),
        ({"Pod": {}, "NodeNames": [1]}, "NodeNames[0]"),
        ([], "<root>"),
    ],
)
def test_malformed_filter_args_name_the_field(raw: object, path: str) -> None:
    with pytest.raises(ContractError) as info:
        ExtenderArgs.from_dict(raw)
    assert str(info.value).startswith(path)


def test_bind_args_without_uid_are_refused() -> None:
    with pytest.raises(ContractError, match="PodUID"):
        ExtenderBindingArgs.from_dict({"PodName": "p", "PodNamespace": "n", "Node": "x"})


BIND = {"PodName": "trainer-0", "PodNamespace": "ml-team", "PodUID": "u-1", "Node": "cpu-1"}


@pytest.mark.parametrize(
    ("field", "length"),
    [("PodUID", 70_000), ("PodUID", 129), ("PodName", 254), ("PodNamespace", 64), ("Node", 254)],
)
def test_binding_args_past_kubernetes_length_limits_are_refused(field: str, length: int) -> None:
    with pytest.raises(ContractError, match="Kubernetes allows at most") as info:
        ExtenderBindingArgs.from_dict({**BIND, field: "x" * length})
    assert info.value.path == field


def test_binding_args_at_kubernetes_length_limits_are_accepted() -> None:
    raw = {**BIND, "PodUID": "u" * 128, "PodName": "p" * 253, "PodNamespace": "n" * 63}
    assert ExtenderBindingArgs.from_dict(raw).pod_uid == "u" * 128


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"Pod": {"metadata": {"uid": "u" * 70_000}}, "NodeNames": ["a"]}, "Pod.metadata.uid"),
        ({"Pod": {"metadata": {"uid": ["u"]}}, "NodeNames": ["a"]}, "Pod.metadata.uid"),
        ({"Pod": {"metadata": {"name": "p" * 254}}, "NodeNames": ["a"]}, "Pod.metadata.name"),
        ({"Pod": {"metadata": []}, "NodeNames": ["a"]}, "Pod.metadata"),
        ({"Pod": {}, "NodeNames": ["a", "n" * 254]}, "NodeNames[1]"),
        ({"Pod": {}, "NodeNames": [["a"]]}, "NodeNames[0]"),
        ({"Pod": {}, "Nodes": {"items": [1]}}, "Nodes.items[0]"),
        ({"Pod": {}, "Nodes": {"items": {}}}, "Nodes.items"),
        (
            {"Pod": {}, "Nodes": {"items": [{"metadata": {"name": 7}}]}},
            "Nodes.items[0].metadata.name",
        ),
    ],
)
def test_extender_args_with_wrong_types_or_lengths_name_the_field(raw: object, path: str) -> None:
    with pytest.raises(ContractError) as info:
        ExtenderArgs.from_dict(raw)
    assert info.value.path == path


def nested(depth: int) -> dict[str, object]:
    value: dict[str, object] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_objects_nested_past_64_levels_are_refused_at_64_accepted() -> None:
    # Nodes, items and the node are three levels; the spec's innermost object is the 64th.
    node = {"metadata": {"name": "n"}, "spec": {"leaf": 1, **nested(61)}}
    assert ExtenderArgs.from_dict({"Pod": {}, "Nodes": {"items": [node]}}).nodes is not None
    too_deep = {"metadata": {"name": "n"}, "spec": {"leaf": 1, **nested(62)}}
    with pytest.raises(ContractError, match="nests deeper than 64 levels") as info:
        ExtenderArgs.from_dict({"Pod": {}, "Nodes": {"items": [too_deep]}})
    assert info.value.path == "Nodes"
    with pytest.raises(ContractError, match="nests deeper"):
        ExtenderArgs.from_dict({"Pod": {"spec": [[[nested(1000)]]]}, "NodeNames": []})
