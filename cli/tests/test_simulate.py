from __future__ import annotations

import pytest

from rgpu_cli.simulate import SpecError, load_spec, simulate

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
