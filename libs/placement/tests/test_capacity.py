"""A request no server could ever take is told apart from one that waits for capacity: the
fleet is judged idle, healthy, ready and uncordoned."""

from __future__ import annotations

from rgpu_contracts import ContainerKind, ContainerRequest
from rgpu_placement import capable_servers, demand_of, never_fits


def ask(count: int, memory: int = 0):
    return demand_of(
        (ContainerRequest(name="main", kind=ContainerKind.APP, count=count, memory_mib=memory),)
    )


def test_sixteen_cards_on_four_card_servers_never_fit_and_the_largest_is_named(make) -> None:
    fleet = make.fleet(make.server("gpu-a", cards=4), make.server("gpu-b", cards=2))
    found = never_fits(fleet, ask(16), "server")
    assert found is not None
    assert "the largest server, gpu-a, has 4 card(s)" in found.line
    assert "ask for less" in found.line


def test_more_memory_than_any_card_has_never_fits(make) -> None:
    fleet = make.fleet(make.server("gpu-a", cards=4, memory=40960))
    assert never_fits(fleet, ask(1, memory=81920), "card") is not None


def test_a_request_that_fits_an_idle_server_is_only_waiting(make) -> None:
    busy = make.server("gpu-a", cards=4, ready=False)
    assert never_fits(make.fleet(busy), ask(4), "server") is None


def test_an_empty_fleet_says_nothing_about_sizes(make) -> None:
    assert never_fits(make.fleet(), ask(1), "server") is None


def test_capable_servers_counts_the_servers_one_member_of_a_gang_could_take(make) -> None:
    fleet = make.fleet(
        make.server("a", cards=4), make.server("b", cards=2), make.server("c", cards=1)
    )
    assert capable_servers(fleet, ask(2), "server") == 2
