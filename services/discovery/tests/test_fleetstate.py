from __future__ import annotations

import time

import orjson
import pytest

from rgpu_contracts import Fleet
from rgpu_discovery.fleetstate import FleetState, ProbeReport
from rgpu_discovery.lupine import ProbeOutcome


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


def report(outcome: str, *busy: str, endpoint: str = "10.0.0.1:14833") -> ProbeReport:
    result = ProbeOutcome(result=outcome, busy=frozenset(busy))
    return ProbeReport(server="gpu-a", endpoint=endpoint, outcome=result)


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


def test_busy_set_change_moves_revision_once_per_batch(fleet: FleetState, gpu_a) -> None:
    revision = listed(fleet, gpu_a())
    assert fleet.apply_probes([report("usage", "GPU-1"), report("usage", "GPU-1", "GPU-2")])
    assert fleet.snapshot().revision == revision + 1
    assert fleet.fleet().servers[0].busy == {"GPU-1", "GPU-2"}


def test_same_busy_set_again_does_not_move_revision(fleet: FleetState, gpu_a) -> None:
    listed(fleet, gpu_a())
    fleet.apply_probes([report("usage", "GPU-1")])
    revision = fleet.snapshot().revision
    assert not fleet.apply_probes([report("usage", "GPU-1")])
    assert fleet.snapshot().revision == revision


def test_one_failed_probe_changes_nothing_the_second_makes_unreachable(
    fleet: FleetState, gpu_a
) -> None:
    revision = listed(fleet, gpu_a())
    fleet.apply_probes([report("timeout")])
    assert fleet.snapshot().revision == revision
    fleet.apply_probes([report("refused")])
    assert fleet.snapshot().revision == revision + 1
    assert not fleet.fleet().servers[0].reachable


def test_probe_for_an_old_endpoint_is_ignored(fleet: FleetState, gpu_a) -> None:
    revision = listed(fleet, gpu_a())
    assert not fleet.apply_probes([report("usage", "GPU-1", endpoint="10.9.9.9:14833")])
    assert fleet.snapshot().revision == revision


def test_probe_state_survives_node_updates(fleet: FleetState, gpu_a) -> None:
    listed(fleet, gpu_a())
    fleet.apply_probes([report("usage", "GPU-2")])
    fleet.apply(gpu_a(ready="False"))
    assert fleet.fleet().servers[0].busy == {"GPU-2"}


def test_forgotten_server_comes_back_unprobed(fleet: FleetState, gpu_a) -> None:
    listed(fleet, gpu_a())
    fleet.apply_probes([report("usage", "GPU-2")])
    fleet.remove("gpu-a")
    fleet.apply(gpu_a())
    server = fleet.fleet().servers[0]
    assert (server.busy, server.usage_reported) == (frozenset(), False)


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


def test_revision_starts_at_the_clock_in_ms_so_a_restart_never_reuses_one() -> None:
    before = time.time_ns() // 1_000_000
    assert FleetState(default_port=14833).snapshot().revision >= before
