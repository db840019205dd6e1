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
