"""Which new fleets wake refused pods: those that make room (a server appearing or becoming
usable, more healthy cards, fewer busy or cordoned ones, a CUDA version learned), and no
other."""

from __future__ import annotations

import dataclasses

import pytest

from rgpu_allocator.growth import capacity_grew, wake_on_growth
from rgpu_placement import FleetView

KEYS = ("rack",)


@pytest.mark.parametrize(
    ("before", "after", "grew"),
    [
        ({"ready": False}, {}, True),
        ({"reachable": False}, {}, True),
        ({"unhealthy": (0, 1)}, {}, True),
        ({"busy": (0,)}, {}, True),
        ({}, {"ready": False}, False),
        ({}, {}, False),
    ],
)
def test_capacity_grows_when_a_server_becomes_usable_or_frees_cards(build, before, after, grew):
    old = FleetView.build(build.fleet(build.server("a", **before)), None, KEYS)
    new = FleetView.build(build.fleet(build.server("a", **after)), None, KEYS)
    assert capacity_grew(old, new) is grew


def test_a_new_server_is_new_capacity_but_the_first_fleet_is_not(build):
    one = FleetView.build(build.fleet(build.server("a")), None, KEYS)
    two = FleetView.build(build.fleet(build.server("a"), build.server("b")), None, KEYS)
    assert capacity_grew(one, two)
    assert not capacity_grew(None, two)


@pytest.mark.parametrize(
    ("before", "after", "grew"),
    [
        ({"cordoned": True}, {}, True),
        ({"card_cordon": True}, {}, True),
        ({"cuda_version": None}, {"cuda_version": "12.4"}, True),
        ({}, {"cordoned": True}, False),
        ({}, {"card_cordon": True}, False),
    ],
)
def test_uncordoning_or_a_cuda_version_learned_is_new_capacity(build, before, after, grew):
    def server(cordoned=False, card_cordon=False, cuda_version="12.4"):
        made = build.server("a")
        cards = (dataclasses.replace(made.cards[0], cordoned=card_cordon), *made.cards[1:])
        return dataclasses.replace(made, cordoned=cordoned, cards=cards, cuda_version=cuda_version)

    old = FleetView.build(build.fleet(server(**before)), None, KEYS)
    new = FleetView.build(build.fleet(server(**after)), None, KEYS)
    assert capacity_grew(old, new) is grew


def test_the_fleet_hook_wakes_only_when_capacity_grew(build):
    woken: list[str] = []
    hook = wake_on_growth(lambda: woken.append("woken"))
    one = FleetView.build(build.fleet(build.server("a")), None, KEYS)
    two = FleetView.build(build.fleet(build.server("a"), build.server("b")), None, KEYS)
    hook(None, one)
    hook(two, one)
    assert woken == []
    hook(one, two)
    assert woken == ["woken"]
