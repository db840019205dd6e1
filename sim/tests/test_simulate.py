from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml
from typer.testing import CliRunner

from rgpu_cli.main import app
from rgpu_sim.simulate import SpecError, load_spec, simulate
from rgpu_testkit import flat

SVG = "{http://www.w3.org/2000/svg}"

SPEC = {
    "seed": 1,
    "fleet": {"servers": 4, "cards": 4, "memory_mib": 40960},
    "workload": {
        "pods": 40,
        "arrival_rate": 1.0,
        "run_seconds": [20, 60],
        "shapes": [{"cards": 1, "weight": 3}, {"cards": [2], "memory_mib": 40960}],
    },
}


def test_card_granularity_packs_more_pods_than_server_granularity() -> None:
    spec = load_spec(SPEC)
    server, card = simulate(spec, "server"), simulate(spec, "card")
    assert len(server.waits) == len(card.waits) == 40
    assert server.never_placed == card.never_placed == 0
    assert card.makespan < server.makespan
    assert server.held_share() >= server.used_share()
    assert card.held_share() == pytest.approx(card.used_share())


def test_simulation_is_deterministic_for_a_seed() -> None:
    spec = load_spec(SPEC)
    first, second = simulate(spec, "server"), simulate(spec, "server")
    assert first.waits == second.waits
    assert first.refusals == second.refusals


def test_a_pod_larger_than_any_server_is_never_placed() -> None:
    spec = load_spec(
        {**SPEC, "workload": {**SPEC["workload"], "shapes": [{"cards": 8}], "pods": 3}}
    )
    result = simulate(spec, "card")
    assert result.never_placed == 3
    assert result.refusals["NodeInsufficientDevice"] == 3


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ([], "spec"),
        (
            {"fleet": {"servers": 0, "cards": 1}, "workload": {"pods": 1, "arrival_rate": 1}},
            "servers",
        ),
        ({"fleet": {"servers": 1, "cards": 1}, "workload": {"pods": 1}}, "arrival_rate"),
        (
            {
                "fleet": {"servers": 1, "cards": 1},
                "workload": {"pods": 1, "arrival_rate": 1, "shapes": [{"cards": "x"}]},
            },
            "shapes[0].cards",
        ),
        (
            {
                "fleet": {"servers": 1, "cards": 1},
                "workload": {"pods": 1, "arrival_rate": 1, "run_seconds": 5},
            },
            "run_seconds",
        ),
    ],
)
def test_bad_specs_name_the_key(raw: object, key: str) -> None:
    with pytest.raises(SpecError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_spec(raw)


TEAMS = {
    "seed": 2,
    "fleet": {"servers": 4, "cards": 2, "memory_mib": 40960},
    "queues": {"namespaces": {"team-a": {"cards": 2, "weight": 1}, "team-b": {"weight": 3}}},
    "workload": {
        "pods": 120,
        "arrival_rate": 2.0,
        "run_seconds": [20, 40],
        "namespaces": {"team-a": 1, "team-b": 1},
        "shapes": [{"cards": 1}],
    },
}


def test_a_quota_caps_what_a_namespace_holds_and_its_pods_wait_for_it() -> None:
    result = simulate(load_spec(TEAMS), "card")
    assert result.never_placed == 0
    assert result.most_held["team-a"] == 2
    assert result.most_held["team-b"] > 2
    assert result.refusals["QuotaExceeded"] > 0


def test_the_heavier_weight_waits_less_when_the_pool_is_short() -> None:
    spec = load_spec({**TEAMS, "queues": {"namespaces": {"team-b": {"weight": 3}}}})
    result = simulate(spec, "card")
    assert result.wait(50, "team-b") < result.wait(50, "team-a")
    even = simulate(load_spec({**TEAMS, "queues": None}), "card")
    assert abs(even.wait(50, "team-b") - even.wait(50, "team-a")) < result.wait(50, "team-a")


def test_a_gang_is_placed_whole_at_one_moment_or_not_at_all() -> None:
    workload = {**TEAMS["workload"], "pods": 12, "shapes": [{"cards": 1, "gang": 4}]}
    fits = simulate(load_spec({**TEAMS, "queues": None, "workload": workload}), "server")
    assert fits.never_placed == 0 and len(fits.waits) == 12
    too_big = {**workload, "pods": 5, "shapes": [{"cards": 1, "gang": 5}]}
    never = simulate(load_spec({**TEAMS, "queues": None, "workload": too_big}), "server")
    assert never.never_placed == 5 and never.waits == []


def test_a_namespace_without_a_spread_replays_as_before() -> None:
    plain = load_spec(SPEC)
    spread = load_spec({**SPEC, "workload": {**SPEC["workload"], "namespaces": {"default": 1}}})
    assert simulate(plain, "card").waits == simulate(spread, "card").waits


@pytest.mark.parametrize(
    ("queues", "shapes", "key"),
    [
        ({"namespaces": {"team-a": {"cards": -1}}}, None, "queues.namespaces.team-a.cards"),
        ({"teams": {}}, None, "queues.teams"),
        (None, [{"cards": 1, "gang": 1}], "shapes[0].gang"),
    ],
)
def test_bad_queues_and_gangs_name_the_key(queues: object, shapes: object, key: str) -> None:
    workload = {**SPEC["workload"], **({"shapes": shapes} if shapes else {})}
    with pytest.raises(SpecError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_spec({**SPEC, "queues": queues, "workload": workload})


# --- the command: shapes that never fit, whole reasons at 80 columns, the timeline -----------


def write_spec(tmp_path: Path, **workload: object) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "workload": {**SPEC["workload"], **workload}}))
    return spec


def run(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["simulate", *args])
    return result.exit_code, result.output


def test_a_shape_no_layout_can_take_is_named_and_exits_1_without_figures(tmp_path: Path) -> None:
    shapes = [{"cards": 1}, {"cards": 16}, {"cards": 1, "memory_mib": 100_000}]
    code, output = run(str(write_spec(tmp_path, shapes=shapes)))
    assert code == 1
    text = flat(output)
    assert "shape cards [16] fits no layout: never fits" in text
    assert "NodeInsufficientDevice" in text
    assert "shape cards [1], 100000 MiB each fits no layout: never fits" in text
    assert "CardInsufficientMemory" in text
    assert "wait p50" not in output
    assert "shape cards [1] fits" not in text


def test_a_shape_only_some_layouts_can_take_is_noted_under_the_figures(tmp_path: Path) -> None:
    """Two cards fit a 4-card server but no one-card lupine instance: a comparison, not an
    error."""
    code, output = run(str(write_spec(tmp_path)))
    assert code == 0, output
    text = flat(output)
    assert "per-GPU instances: shape cards [2], 40960 MiB each is never placed" in text
    assert "granularity server: shape cards" not in text


def test_reasons_are_whole_at_80_columns_and_in_the_same_order_every_run(tmp_path: Path) -> None:
    spec = str(write_spec(tmp_path))
    code, output = run(spec)
    assert code == 0, output
    assert "ExclusiveDeviceAllocateConflict" in output
    assert "…" not in output
    assert run(spec)[1] == output


def test_the_timeline_has_a_lane_per_server_and_a_bar_per_pod_in_each_layout(
    tmp_path: Path,
) -> None:
    svg = tmp_path / "timeline.svg"
    code, output = run(str(write_spec(tmp_path)), "--timeline", str(svg))
    assert code == 0, output
    assert f"timeline: {svg}" in flat(output)
    root = ElementTree.parse(svg).getroot()
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    titles = [t for t in texts if t.startswith(("granularity", "per-GPU"))]
    assert len(titles) == 3
    assert texts.count("gpu-001") == 3  # per-GPU instances drawn in their node's lane
    bars = [t.text or "" for t in root.iter(f"{SVG}title")]
    unplaced = simulate(load_spec(SPEC), "server", per_gpu=True).never_placed
    assert len(bars) == 3 * 40 - unplaced  # a bar per pod placed, in each layout
    assert all(": " in bar and " card(s), " in bar for bar in bars)


def test_per_gpu_instances_hold_only_the_cards_asked_for_and_cannot_place_multi_card_pods() -> None:
    one_card = {**SPEC["workload"], "shapes": [{"cards": 1}]}
    single = load_spec({**SPEC, "workload": one_card})
    server, instances = simulate(single, "server"), simulate(single, "server", per_gpu=True)
    assert instances.label == "per-GPU instances"
    assert instances.never_placed == 0
    assert instances.held_share() == pytest.approx(instances.used_share())
    assert server.held_share() > server.used_share()
    assert instances.makespan < server.makespan
    mixed = simulate(load_spec(SPEC), "server", per_gpu=True)
    assert mixed.never_placed > 0
    assert mixed.refusals["NodeInsufficientDevice"] == mixed.never_placed
