from __future__ import annotations

from collections.abc import Callable

import pytest

from rgpu_discovery.probestate import ProbeState
from rgpu_discovery.servers import build_server, decode_cards, port_problem

DEFAULT = 14833


@pytest.fixture
def server(build):
    def make(**node_args: object):
        manifest = build.node("gpu-a", **node_args)
        v = build.view(manifest)
        return build_server(v, decode_cards(v.name, v.register), ProbeState(), DEFAULT)

    return make


@pytest.mark.parametrize(
    ("label", "port"),
    [
        ("", DEFAULT),
        ("24000", 24000),
        ("not-a-port", DEFAULT),
        ("0", DEFAULT),
        ("70000", DEFAULT),
        ("65535", 65535),
        ("-1", DEFAULT),
        ("\uff11\uff12\uff13", DEFAULT),
    ],
)
def test_port_comes_from_label_or_falls_back_to_default(server, label: str, port: int) -> None:
    built = server(server=label, annotation="[]")
    assert (built.port, built.endpoint) == (port, f"10.0.0.1:{port}")
    assert built.error is None


@pytest.mark.parametrize("label", ["", "not-a-port", "0", "70000"])
def test_unusable_port_label_names_the_problem(build, label: str) -> None:
    problem = port_problem(build.view(build.node("gpu-a", server=label)), DEFAULT)
    assert problem is not None
    assert str(DEFAULT) in problem


def test_valid_port_label_has_no_problem(build) -> None:
    assert port_problem(build.view(build.node("gpu-a", server="24000")), DEFAULT) is None


def test_ipv6_internal_ip_is_bracketed(server) -> None:
    built = server(server="24000", ip="fd00::7", annotation="[]")
    assert built.endpoint == "[fd00::7]:24000"


def test_no_internal_ip_lists_server_with_error_and_no_cards(build, server) -> None:
    built = server(ip=None, annotation=build.register(build.card("GPU-1")))
    assert built.endpoint is None
    assert built.cards == ()
    assert built.error is not None
    assert "InternalIP" in built.error


def test_mixed_modes_keep_only_remote_cards_and_absent_health_is_unhealthy(
    server, load_fixture: Callable[[str], object]
) -> None:
    examples = load_fixture("hami/node-register-examples.json")
    assert isinstance(examples, dict)
    built = server(annotation=examples["mixed_modes_one_unhealthy"])
    assert [(c.id, c.index, c.healthy) for c in built.cards] == [
        ("gpu-a/GPU-aaa", 0, True),
        ("gpu-a/GPU-bbb", 1, False),
    ]
    assert built.cards[0].model == "NVIDIA-H100-80GB-HBM3"
    assert built.cards[0].memory_mib == 81920


def test_card_fields_come_from_register_with_original_model(build, server) -> None:
    annotation = build.register(
        build.card("GPU-9", 3, devmem=1000, devcore=50, numa=1, type="NVIDIA A100 (odd name)")
    )
    (card,) = server(annotation=annotation).cards
    assert (card.id, card.server, card.uuid, card.index) == ("gpu-a/GPU-9", "gpu-a", "GPU-9", 3)
    assert (card.memory_mib, card.cores, card.numa, card.model) == (
        1000,
        50,
        1,
        "NVIDIA A100 (odd name)",
    )


@pytest.mark.parametrize("key", ["garbage", "not_json_legacy_codec"])
def test_undecodable_register_lists_server_with_error_and_no_cards(
    server, load_fixture: Callable[[str], object], key: str
) -> None:
    examples = load_fixture("hami/node-register-examples.json")
    assert isinstance(examples, dict)
    built = server(annotation=examples[key])
    assert built.cards == ()
    assert built.error is not None
    assert "hami.io/node-nvidia-register" in built.error


def test_undecodable_register_is_flagged_for_an_event(build) -> None:
    assert decode_cards(build.view(build.node("gpu-a")).name, "{not json").undecodable


def test_missing_register_is_an_error_but_not_an_event() -> None:
    register = decode_cards("gpu-a", None)
    assert register.error is not None
    assert not register.undecodable


def test_topology_labels_are_copied_onto_server(build, server) -> None:
    built = server(labels={build.rack: "r1", "other": "x"}, annotation="[]")
    assert built.topology == ((build.rack, "r1"),)


def test_probe_state_is_carried_onto_server(build) -> None:
    v = build.view(build.node("gpu-a", annotation="[]"))
    probe = ProbeState(reachable=False, usage_reported=True, busy=frozenset({"GPU-1"}))
    built = build_server(v, decode_cards(v.name, v.register), probe, DEFAULT)
    assert (built.reachable, built.usage_reported, built.busy) == (False, True, {"GPU-1"})
