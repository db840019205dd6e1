from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from rgpu_contracts import Fleet
from rgpu_contracts.ids import ServerName
from rgpu_discovery.fleet import FleetState, ProbeState, build_server
from rgpu_discovery.lupine import ProbeOutcome, ProbeResult
from rgpu_discovery.nodes import decode_cards
from rgpu_discovery.probe_states import StampedState

DEFAULT = 14833


@pytest.fixture
def fleet() -> FleetState:
    return FleetState(default_port=14833, clock=lambda: 1000.0)


@pytest.fixture
def gpu_a(build):
    """Server gpu-a with two healthy cards, as a function of Node overrides."""

    def make(**overrides: object):
        args = {"annotation": build.register(build.card("GPU-1"), build.card("GPU-2", 1))}
        args.update(overrides)
        return build.view(build.node("gpu-a", **args))

    return make


def listed(fleet: FleetState, *views) -> int:
    fleet.replace_all(views)
    return fleet.snapshot().revision


def stamped(
    *busy: str,
    endpoint: str = "10.0.0.1:14833",
    probe: ProbeState | None = None,
    since: int = 0,
    version: int = 1,
) -> StampedState:
    """gpu-a's state as read from its Lease (busy ``busy`` unless ``probe`` is given)."""
    if probe is None:
        probe = ProbeState(probed=True, usage_reported=True, busy=frozenset(busy))
    return StampedState(
        server=ServerName("gpu-a"),
        endpoint=endpoint,
        probe=probe,
        version=str(version),
        since=since,
        renewed_at=0.0,
        holder="discovery-1",
    )


def test_nothing_is_listed_before_the_first_list(fleet: FleetState) -> None:
    assert not fleet.snapshot().listed


def test_first_list_publishes_even_when_empty(fleet: FleetState) -> None:
    before = fleet.snapshot().revision
    assert listed(fleet) == before + 1
    assert fleet.snapshot().listed
    assert fleet.fleet().servers == ()


def test_identical_relist_does_not_move_the_revision(fleet: FleetState, gpu_a) -> None:
    revision = listed(fleet, gpu_a())
    assert listed(fleet, gpu_a()) == revision


def test_relist_without_a_server_removes_it(fleet: FleetState, gpu_a) -> None:
    revision = listed(fleet, gpu_a())
    assert listed(fleet) == revision + 1
    assert fleet.fleet().servers == ()


def test_relabel_of_irrelevant_labels_and_annotations_does_not_move_revision(
    fleet: FleetState, gpu_a, build
) -> None:
    revision = listed(fleet, gpu_a())
    fleet.apply(gpu_a(labels={"team": "ml", "kubernetes.io/arch": "arm64"}, uid="other"))
    assert fleet.snapshot().revision == revision


@pytest.mark.parametrize(
    "change",
    [
        {"ready": "False"},
        {"ip": "10.0.0.2"},
        {"server": "24000"},
        {"labels": {"topology.rgpu.io/rack": "r9"}},
        {"annotation": '[{"id":"GPU-1","mode":"remote","health":true,"devmem":1}]'},
        {"annotation": '[{"id":"GPU-1","mode":"remote"},{"id":"GPU-2","index":1,"mode":"remote"}]'},
    ],
)
def test_each_relevant_change_moves_revision_by_one(
    fleet: FleetState, gpu_a, change: dict[str, object]
) -> None:
    revision = listed(fleet, gpu_a())
    fleet.apply(gpu_a(**change))
    assert fleet.snapshot().revision == revision + 1


def test_register_text_change_with_same_cards_does_not_move_revision(
    fleet: FleetState, gpu_a, build
) -> None:
    revision = listed(fleet, gpu_a())
    same = build.register(build.card("GPU-1"), build.card("GPU-2", 1, count=4))
    fleet.apply(gpu_a(annotation=same))
    assert fleet.snapshot().revision == revision


def test_removing_a_known_server_publishes_and_an_unknown_one_does_not(
    fleet: FleetState, gpu_a
) -> None:
    revision = listed(fleet, gpu_a())
    assert fleet.remove("gpu-b") is False
    assert fleet.snapshot().revision == revision
    assert fleet.remove("gpu-a") is True
    assert fleet.snapshot().revision == revision + 1


def test_states_applied_together_move_the_revision_once(fleet: FleetState, gpu_a) -> None:
    revision = listed(fleet, gpu_a())
    assert fleet.apply_states([stamped("GPU-1"), stamped("GPU-1", "GPU-2")])
    assert fleet.snapshot().revision == revision + 1
    assert fleet.fleet().servers[0].busy == {"GPU-1", "GPU-2"}


def test_same_busy_set_again_does_not_move_revision(fleet: FleetState, gpu_a) -> None:
    listed(fleet, gpu_a())
    fleet.apply_states([stamped("GPU-1")])
    revision = fleet.snapshot().revision
    assert not fleet.apply_states([stamped("GPU-1", version=9)])
    assert fleet.snapshot().revision == revision


def test_unreachable_state_is_published(fleet: FleetState, gpu_a) -> None:
    revision = listed(fleet, gpu_a())
    down = ProbeState(reachable=False, failures=2, probed=True)
    fleet.apply_states([stamped(probe=down)])
    assert fleet.snapshot().revision == revision + 1
    assert not fleet.fleet().servers[0].reachable


def test_state_for_an_old_endpoint_is_ignored(fleet: FleetState, gpu_a) -> None:
    revision = listed(fleet, gpu_a())
    assert not fleet.apply_states([stamped("GPU-1", endpoint="10.9.9.9:14833")])
    assert fleet.snapshot().revision == revision


def test_probe_state_survives_node_updates(fleet: FleetState, gpu_a) -> None:
    listed(fleet, gpu_a())
    fleet.apply_states([stamped("GPU-2")])
    fleet.apply(gpu_a(ready="False"))
    assert fleet.fleet().servers[0].busy == {"GPU-2"}


def test_state_known_before_the_node_applies_when_it_is_listed(fleet: FleetState, gpu_a) -> None:
    fleet.apply_states([stamped("GPU-2")])
    listed(fleet, gpu_a())
    assert fleet.fleet().servers[0].busy == {"GPU-2"}


def test_server_whose_state_was_deleted_is_unprobed_again(fleet: FleetState, gpu_a) -> None:
    listed(fleet, gpu_a())
    fleet.apply_states([stamped("GPU-2")])
    revision = fleet.snapshot().revision
    assert fleet.apply_states((), ["gpu-a"])
    server = fleet.fleet().servers[0]
    assert (server.busy, server.usage_reported) == (frozenset(), False)
    assert fleet.snapshot().revision == revision + 1


def test_revision_is_the_newest_resource_version_behind_the_fleet(fleet: FleetState, gpu_a) -> None:
    fleet.replace_all([gpu_a()], {"gpu-a": 40})
    assert fleet.snapshot().revision == 40
    fleet.apply_states([stamped("GPU-1", since=55)])
    assert fleet.snapshot().revision == 55


def test_a_change_older_than_the_revision_still_moves_it_up(fleet: FleetState, gpu_a) -> None:
    fleet.replace_all([gpu_a()], {"gpu-a": 40})
    fleet.apply_states([stamped("GPU-1", since=30)])
    assert fleet.snapshot().revision == 41


def test_a_replica_listing_later_computes_the_same_revision(gpu_a) -> None:
    watched = FleetState(default_port=DEFAULT)
    watched.replace_all([gpu_a()], {"gpu-a": 40})
    watched.apply_states([stamped("GPU-1", since=55)])
    watched.apply_states([stamped("GPU-1", since=55, version=70)])
    late = FleetState(default_port=DEFAULT)
    late.apply_states([stamped("GPU-1", since=55, version=70)])
    late.replace_all([gpu_a()], {"gpu-a": 40})
    assert late.snapshot().revision == watched.snapshot().revision == 55
    assert late.fleet().servers == watched.fleet().servers


def test_new_or_moved_endpoint_signals_the_prober(fleet: FleetState, gpu_a) -> None:
    signal = fleet.targets_changed.revision
    listed(fleet, gpu_a())
    assert fleet.targets_changed.revision == signal + 1
    fleet.apply(gpu_a(ready="False"))
    assert fleet.targets_changed.revision == signal + 1
    fleet.apply(gpu_a(ip="10.0.0.9"))
    assert fleet.targets_changed.revision == signal + 2
    assert fleet.targets() == {"gpu-a": "10.0.0.9:14833"}


def test_body_is_the_fleet_contract_sorted_by_name(fleet: FleetState, build) -> None:
    views = [build.view(build.node(n, annotation="[]")) for n in ("gpu-c", "gpu-a", "gpu-b")]
    listed(fleet, *views)
    decoded = Fleet.from_dict(orjson.loads(fleet.snapshot().body()))
    assert decoded == fleet.fleet()
    assert [s.name for s in decoded.servers] == ["gpu-a", "gpu-b", "gpu-c"]


BUSY = ProbeState(probed=True, usage_reported=True, busy=frozenset({"GPU-1"}))


def outcome(result: ProbeResult, *busy: str) -> ProbeOutcome:
    return ProbeOutcome(result=result, busy=frozenset(busy))


def test_never_probed_server_is_reachable_with_unknown_usage() -> None:
    state = ProbeState()
    assert (state.reachable, state.usage_reported, state.busy, state.probed) == (
        True,
        False,
        frozenset(),
        False,
    )


def test_usage_reply_replaces_busy_set() -> None:
    assert BUSY.after(outcome("usage", "GPU-2")).busy == {"GPU-2"}


def test_empty_usage_reply_clears_busy_set() -> None:
    state = BUSY.after(outcome("usage"))
    assert (state.busy, state.usage_reported) == (frozenset(), True)


def test_404_means_no_usage_reporting_but_reachable() -> None:
    state = BUSY.after(outcome("no_usage"))
    assert (state.reachable, state.usage_reported, state.busy) == (True, False, frozenset())


@pytest.mark.parametrize(
    "result", ["http_error", "bad_body", "h2_alive", "timeout", "refused", "unreachable"]
)
def test_anything_but_a_usage_reply_keeps_the_busy_set(result: ProbeResult) -> None:
    state = BUSY.after(outcome(result))
    assert (state.busy, state.usage_reported) == ({"GPU-1"}, True)


@pytest.mark.parametrize("result", ["timeout", "refused", "unreachable"])
def test_one_failed_probe_keeps_server_reachable(result: ProbeResult) -> None:
    assert BUSY.after(outcome(result)).reachable


def test_two_failed_probes_in_a_row_make_server_unreachable() -> None:
    state = BUSY.after(outcome("timeout")).after(outcome("refused"))
    assert not state.reachable
    assert state.after(outcome("unreachable")) == state


def test_an_answer_between_failures_resets_the_count() -> None:
    state = BUSY.after(outcome("timeout")).after(outcome("h2_alive")).after(outcome("timeout"))
    assert state.reachable


@pytest.mark.parametrize("result", ["usage", "no_usage", "http_error", "bad_body", "h2_alive"])
def test_any_answer_makes_an_unreachable_server_reachable(result: ProbeResult) -> None:
    down = BUSY.after(outcome("timeout")).after(outcome("timeout"))
    assert down.after(outcome(result)).reachable


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


def test_topology_labels_are_copied_onto_server(build, server) -> None:
    built = server(labels={build.rack: "r1", "other": "x"}, annotation="[]")
    assert built.topology == ((build.rack, "r1"),)


def test_probe_state_is_carried_onto_server(build) -> None:
    v = build.view(build.node("gpu-a", annotation="[]"))
    probe = ProbeState(reachable=False, usage_reported=True, busy=frozenset({"GPU-1"}))
    built = build_server(v, decode_cards(v.name, v.register), probe, DEFAULT)
    assert (built.reachable, built.usage_reported, built.busy) == (False, True, {"GPU-1"})
