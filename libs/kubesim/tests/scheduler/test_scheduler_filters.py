"""kube-scheduler's default filters, FitError text, event rules and extender wire handling, as
pure functions over apiserver JSON."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from rgpu_kubesim.scheduler._extender_calls import (
    ExtenderError,
    extender_pod,
    parse_filter,
    parse_scores,
)
from rgpu_kubesim.scheduler._scheduling import (
    NodeVerdicts,
    filter_inputs,
    filter_node,
    find_feasible,
    fit_error,
    is_interested,
    node_changed,
    num_nodes_to_find,
    pod_updated,
    select_host,
    tolerates,
)

READY = {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-29T10:00:00Z"}


def node(name: str = "n", *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"conditions": [READY]},
    }


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u1"}, "spec": spec}


TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, True),
        ({"key": "dedicated", "value": "gpu"}, True),
        ({"key": "dedicated", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),
        ({"key": "dedicated", "operator": "Equal", "value": "cpu"}, False),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_toleration_matching_follows_kubernetes(toleration: dict[str, str], expected: bool) -> None:
    assert tolerates(pod(tolerations=[toleration]), TAINT) is expected


def test_a_fitting_node_has_no_reason() -> None:
    assert filter_node(pod(), node()) is None


@pytest.mark.parametrize(
    ("status", "taint_key"),
    [("False", "node.kubernetes.io/not-ready"), ("Unknown", "node.kubernetes.io/unreachable")],
)
def test_a_node_that_is_not_ready_is_rejected_as_the_lifecycle_taint(
    status: str, taint_key: str
) -> None:
    sick = node()
    sick["status"]["conditions"] = [{"type": "Ready", "status": status}]
    assert filter_node(pod(), sick) == f"node(s) had untolerated taint {{{taint_key}: }}"
    tolerant = pod(tolerations=[{"key": taint_key, "operator": "Exists"}])
    assert filter_node(tolerant, sick) is None


def test_a_node_without_conditions_counts_as_not_ready() -> None:
    bare = {"metadata": {"name": "n"}}
    assert filter_node(pod(), bare) == (
        "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
    )


def test_a_cordoned_node_is_rejected_unless_the_pod_tolerates_the_cordon() -> None:
    cordoned = node(unschedulable=True)
    assert filter_node(pod(), cordoned) == "node(s) were unschedulable"
    toleration = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
    assert filter_node(pod(tolerations=[toleration]), cordoned) is None


def test_only_no_schedule_and_no_execute_taints_filter() -> None:
    soft = node(taints=[{**TAINT, "effect": "PreferNoSchedule"}])
    hard = node(taints=[{**TAINT, "effect": "NoExecute"}])
    assert filter_node(pod(), soft) is None
    assert filter_node(pod(), hard) == "node(s) had untolerated taint {dedicated: gpu}"


def test_node_selector_must_match_every_label() -> None:
    labelled = node(labels={"pool": "a", "zone": "z1"})
    assert filter_node(pod(nodeSelector={"pool": "a"}), labelled) is None
    assert filter_node(pod(nodeSelector={"pool": "a", "zone": "z2"}), labelled) == (
        "node(s) didn't match Pod's node affinity/selector"
    )


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


@pytest.mark.parametrize(
    ("term", "fits"),
    [
        ({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]}, True),
        ({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "pool", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["8"]}]}, True),
        ({"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["8"]}]}, False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["m"]}]}, False),
        ({}, False),
    ],
)
def test_required_node_affinity_terms(term: dict[str, Any], fits: bool) -> None:
    labelled = node("n", labels={"pool": "a", "cores": "16"})
    reason = filter_node(pod(affinity=_affinity(term)), labelled)
    assert (reason is None) is fits


def test_node_affinity_terms_are_ored() -> None:
    no = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]}
    yes = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
    assert filter_node(pod(affinity=_affinity(no, yes)), node(labels={"pool": "a"})) is None


def test_the_first_failing_plugin_gives_the_reason() -> None:
    everything_wrong = node(unschedulable=True, taints=[TAINT], labels={})
    assert filter_node(pod(nodeSelector={"pool": "a"}), everything_wrong) == (
        "node(s) were unschedulable"
    )


def test_fit_error_is_a_sorted_histogram_of_reasons() -> None:
    reasons = {"a": "2/4 CardBusyOnServer", "b": "node(s) were unschedulable"}
    reasons |= {"c": "2/4 CardBusyOnServer"}
    assert fit_error(5, reasons) == (
        "0/5 nodes are available: 1 node(s) were unschedulable, 2 2/4 CardBusyOnServer."
    )


@pytest.mark.parametrize(
    ("total", "percentage", "expected"),
    [(5, 0, 5), (99, 10, 99), (100, 0, 100), (1000, 0, 420), (5000, 0, 500), (10000, 0, 500)],
)
def test_nodes_to_find_follows_kube_schedulers_adaptive_rule(
    total: int, percentage: int, expected: int
) -> None:
    assert num_nodes_to_find(total, percentage) == expected


def test_nodes_to_find_honours_a_configured_percentage_above_the_minimum() -> None:
    assert num_nodes_to_find(1000, 30) == 300
    assert num_nodes_to_find(1000, 5) == 100


def test_filtering_stops_once_enough_nodes_fit_and_rotates_the_start() -> None:
    nodes = [node(n) for n in "abcde"]
    nodes[1]["spec"]["unschedulable"] = True
    feasible, reasons, start = find_feasible(pod(), nodes, 2, 4)
    assert (feasible, reasons, start) == (["e", "a"], {}, 1)
    feasible, reasons, start = find_feasible(pod(), nodes, 2, start)
    assert (feasible, list(reasons), start) == (["c", "d"], ["b"], 4)


NOT_A_SERVER = {"key": "hami.io/lupine-server", "operator": "DoesNotExist"}
OFF_SERVERS = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [NOT_A_SERVER]}]
        }
    }
}


def test_a_required_affinity_excluding_server_nodes_skips_them_before_the_sample_fills() -> None:
    servers = [node(f"a-server-{i}", labels={"hami.io/lupine-server": "14833"}) for i in range(3)]
    nodes = [*servers, node("b-client"), node("c-client")]
    feasible, reasons, start = find_feasible(pod(affinity=OFF_SERVERS), nodes, 2, 0)
    assert feasible == ["b-client", "c-client"]
    assert set(reasons) == {"a-server-0", "a-server-1", "a-server-2"}
    assert start == 0
    assert find_feasible(pod(), nodes, 2, 0)[0] == ["a-server-0", "a-server-1"]


def test_remembered_verdicts_are_filter_nodes_per_pod_constraints() -> None:
    verdicts = NodeVerdicts()
    zone_a, zone_b = node("x", labels={"zone": "a"}), node("y", labels={"zone": "b"})
    picky = pod(nodeSelector={"zone": "a"})
    alike = {**pod(nodeSelector={"zone": "a"}), "metadata": {"name": "other", "uid": "u2"}}
    for candidate in (picky, alike, pod()):
        for n in (zone_a, zone_b):
            assert verdicts.check(candidate, n) == filter_node(candidate, n)
    # Remembered until cleared: the nodes' own changes are the caller's to report.
    zone_a["spec"]["unschedulable"] = True
    assert verdicts.check(alike, zone_a) is None
    verdicts.clear()
    assert verdicts.check(alike, zone_a) == "node(s) were unschedulable"


def test_filter_inputs_ignore_heartbeats_and_annotations_but_not_what_filters_read() -> None:
    before = node("n", labels={"zone": "a"})
    beat = {**before, "status": {"conditions": [{**READY, "lastHeartbeatTime": "later"}]}}
    annotated = {**before, "metadata": {**before["metadata"], "annotations": {"a": "b"}}}
    assert filter_inputs(beat) == filter_inputs(annotated) == filter_inputs(before)
    not_ready = {**before, "status": {"conditions": [{**READY, "status": "False"}]}}
    changed = (
        node("n", labels={"zone": "b"}),
        node("n", labels={"zone": "a"}, unschedulable=True),
        node("n", labels={"zone": "a"}, taints=[TAINT]),
        not_ready,
    )
    for after in changed:
        assert filter_inputs(after) != filter_inputs(before)


def test_filtering_no_nodes_finds_nothing() -> None:
    assert find_feasible(pod(), [], 0, 3) == ([], {}, 0)


def _with_resources(where: str, kind: str, name: str) -> dict[str, Any]:
    container = {"name": "c", "resources": {kind: {name: "1"}}}
    return pod(**{where: [container]})


@pytest.mark.parametrize("where", ["containers", "initContainers"])
@pytest.mark.parametrize("kind", ["limits", "requests"])
def test_the_extender_is_interested_in_any_container_naming_a_managed_resource(
    where: str, kind: str
) -> None:
    managed = ("nvidia.com/remote-gpu",)
    assert is_interested(_with_resources(where, kind, "nvidia.com/remote-gpu"), managed)
    assert not is_interested(_with_resources(where, kind, "cpu"), managed)


def test_an_extender_without_managed_resources_is_interested_in_every_pod() -> None:
    assert is_interested(pod(containers=[{"name": "c"}]), ())


def test_the_extender_pod_drops_type_meta_and_managed_fields_only() -> None:
    original = pod(containers=[{"name": "c"}])
    original |= {"kind": "Pod", "apiVersion": "v1", "status": {"phase": "Pending"}}
    original["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    shaped = extender_pod(original)
    assert set(shaped) == {"metadata", "spec", "status"}
    assert shaped["metadata"] == {"name": "p", "namespace": "default", "uid": "u1"}
    assert "managedFields" in original["metadata"], "the cached pod must not be changed"


NodeEdit = Callable[[dict[str, Any]], None]


def _set(path: tuple[str, ...], value: Any) -> NodeEdit:
    def edit(obj: dict[str, Any]) -> None:
        for key in path[:-1]:
            obj = obj.setdefault(key, {})
        obj[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "moves"),
    [
        (_set(("status", "conditions"), [{**READY, "lastHeartbeatTime": "later"}]), False),
        (_set(("spec", "unschedulable"), True), False),
        (_set(("metadata", "resourceVersion"), "99"), False),
        (_set(("status", "conditions"), [{**READY, "status": "False"}]), True),
        (_set(("metadata", "labels"), {"rack": "r1"}), True),
        (_set(("metadata", "annotations"), {"hami.io/node-nvidia-register": "[]"}), True),
        (_set(("spec", "taints"), [TAINT]), True),
        (_set(("status", "allocatable"), {"cpu": "8"}), True),
    ],
)
def test_node_updates_that_may_make_a_pod_fit_move_unschedulable_pods(
    edit: NodeEdit, moves: bool
) -> None:
    old = node()
    new = node()
    edit(new)
    assert node_changed(old, new) is moves


def test_uncordoning_a_node_moves_unschedulable_pods() -> None:
    assert node_changed(node(unschedulable=True), node())


@pytest.mark.parametrize(
    ("edit", "updated"),
    [
        (_set(("metadata", "annotations"), {"rgpu.io/retry-at": "now"}), True),
        (_set(("metadata", "labels"), {"team": "ml"}), True),
        (_set(("spec", "tolerations"), [{"operator": "Exists"}]), True),
        (_set(("status", "conditions"), [{"type": "PodScheduled", "status": "False"}]), False),
        (_set(("metadata", "resourceVersion"), "99"), False),
        (_set(("metadata", "managedFields"), [{"manager": "x"}]), False),
    ],
)
def test_pod_updates_other_than_status_and_bookkeeping_count(edit: NodeEdit, updated: bool) -> None:
    new = pod()
    edit(new)
    assert pod_updated(pod(), new) is updated


def test_the_highest_score_wins_and_ties_follow_the_seed() -> None:
    assert select_host(["a", "b", "c"], {"b": 30, "c": 10}, random.Random(0)) == "b"
    picks = [select_host(list("abcd"), {}, random.Random(seed)) for seed in range(8)]
    assert picks == [select_host(list("abcd"), {}, random.Random(seed)) for seed in range(8)]
    assert len(set(picks)) > 1


def test_filter_result_keeps_named_nodes_and_collects_reasons() -> None:
    result = {
        "NodeNames": ["a"],
        "FailedNodes": {"b": "busy", "c": "busy"},
        "FailedAndUnresolvableNodes": {"c": "server node"},
        "Error": "",
    }
    assert parse_filter(result, ["a", "b", "c"]) == (["a"], {"b": "busy", "c": "server node"})


def test_filter_result_with_null_node_names_keeps_nothing() -> None:
    assert parse_filter({"NodeNames": None, "Error": ""}, ["a"]) == ([], {})


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"Error": "allocator unreachable"}, "allocator unreachable"),
        ({"NodeNames": ["z"]}, "not in the input node list"),
        ({"NodeNames": "a"}, "not a list"),
        ({"NodeNames": ["a"], "FailedNodes": ["b"]}, "not a map"),
        (["a"], "not an ExtenderFilterResult"),
    ],
)
def test_unusable_filter_results_are_errors(result: Any, message: str) -> None:
    with pytest.raises(ExtenderError, match=message):
        parse_filter(result, ["a", "b"])


def test_prioritize_scores_are_weighted_and_scaled_like_kube_scheduler() -> None:
    result = [{"Host": "a", "Score": 3}, {"Host": "b", "Score": 10}]
    assert parse_scores(result, 2) == {"a": 60, "b": 200}


@pytest.mark.parametrize("result", [{"Host": "a"}, [{"Host": "a"}], [{"Host": "a", "Score": "x"}]])
def test_unusable_prioritize_results_are_errors(result: Any) -> None:
    with pytest.raises(ExtenderError):
        parse_scores(result, 1)
