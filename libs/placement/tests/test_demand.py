"""A pod's containers read both ways: per container (server) and effective count (card)."""

from __future__ import annotations

from rgpu_placement import Ask, demand_of


def test_effective_count_is_the_larger_of_the_biggest_init_and_all_running(make) -> None:
    demand = demand_of(
        (
            make.container("setup", count=3, kind="init"),
            make.container("proxy", count=1, kind="sidecar"),
            make.container("app", count=1),
        )
    )
    assert demand.effective_count == 3
    more_running = demand_of(
        (make.container("setup", count=1, kind="init"), make.container("app", count=2))
    )
    assert more_running.effective_count == 2


def test_asks_are_distinct_and_hardest_first(make) -> None:
    demand = demand_of(
        (
            make.container("a", count=1, memory=1000),
            make.container("b", count=2, memory=8000),
            make.container("c", count=1, memory=1000),
            make.container("idle", count=0),
        )
    )
    assert demand.asks == (Ask(count=2, memory_mib=8000), Ask(count=1, memory_mib=1000))
    assert demand.max_memory_mib == 8000
    assert len(demand.containers) == 4
