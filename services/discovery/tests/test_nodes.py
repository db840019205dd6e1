from __future__ import annotations

import pytest

from rgpu_discovery.errors import MalformedNode
from rgpu_discovery.nodes import decode_cards, node_name, port_problem

DEFAULT = 14833


def test_server_label_with_empty_value_makes_a_server(build) -> None:
    assert build.view(build.node("gpu-a", server="")).is_server


def test_node_without_server_label_is_a_client(build) -> None:
    result = build.view(build.node("node-1", server=None))
    assert not result.is_server
    assert result.server_label is None


def test_first_internal_ip_wins_over_external_and_later_internal(build) -> None:
    addresses = [
        {"type": "Hostname", "address": "gpu-a"},
        {"type": "ExternalIP", "address": "203.0.113.9"},
        {"type": "InternalIP", "address": "10.0.0.7"},
        {"type": "InternalIP", "address": "10.0.0.8"},
    ]
    assert build.view(build.node("gpu-a", addresses=addresses)).internal_ip == "10.0.0.7"


def test_no_internal_ip_reads_as_none(build) -> None:
    addresses = [{"type": "ExternalIP", "address": "203.0.113.9"}]
    assert build.view(build.node("gpu-a", addresses=addresses)).internal_ip is None


@pytest.mark.parametrize(
    ("status", "ready"), [("True", True), ("False", False), ("Unknown", False), (None, False)]
)
def test_ready_only_when_ready_condition_is_true(build, status: str | None, ready: bool) -> None:
    assert build.view(build.node("gpu-a", ready=status)).ready is ready


def test_topology_keeps_only_configured_keys_in_configured_order(build) -> None:
    labels = {build.zone: "z1", "unrelated": "x", build.rack: "r1"}
    assert build.view(build.node("n", server=None, labels=labels)).topology == (
        (build.rack, "r1"),
        (build.zone, "z1"),
    )


def test_node_without_name_is_malformed() -> None:
    with pytest.raises(MalformedNode, match=r"metadata\.name"):
        node_name({"metadata": {}})


def test_wrongly_typed_fields_are_read_as_absent(build) -> None:
    result = build.view(
        {"metadata": {"name": "gpu-a", "labels": ["x"]}, "status": {"addresses": 3}}
    )
    assert (result.is_server, result.internal_ip, result.ready) == (False, None, False)


@pytest.mark.parametrize("label", ["", "not-a-port", "0", "70000"])
def test_unusable_port_label_names_the_problem(build, label: str) -> None:
    problem = port_problem(build.view(build.node("gpu-a", server=label)), DEFAULT)
    assert problem is not None
    assert str(DEFAULT) in problem


def test_valid_port_label_has_no_problem(build) -> None:
    assert port_problem(build.view(build.node("gpu-a", server="24000")), DEFAULT) is None


def test_undecodable_register_is_flagged_for_an_event(build) -> None:
    assert decode_cards(build.view(build.node("gpu-a")).name, "{not json").undecodable


def test_missing_register_is_an_error_but_not_an_event() -> None:
    register = decode_cards("gpu-a", None)
    assert register.error is not None
    assert not register.undecodable
