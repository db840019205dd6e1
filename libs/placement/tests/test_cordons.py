"""Cordons and CUDA versions decide with the fleet: a cordoned server or card is never booked,
a pod asking for a CUDA major gets only servers reporting it, and refusals say so in HAMi's
format."""

from __future__ import annotations

import dataclasses

import pytest

from rgpu_contracts import Reason, Server, render_reasons
from rgpu_placement import Choice, FleetView, Granularity, Refusal, Unclaimed, choose, demand_of

from .conftest import KEYS, Make


def _cordon(server: Server, *indices: int, node: bool = False) -> Server:
    cards = tuple(
        dataclasses.replace(card, cordoned=card.index in indices) for card in server.cards
    )
    return dataclasses.replace(server, cards=cards, cordoned=node)


def _decide(
    make: Make, *servers: Server, granularity: Granularity = "server", count: int = 1, cuda=None
) -> Choice | Refusal:
    view = FleetView.build(make.fleet(*servers), None, KEYS)
    demand = demand_of((make.container(count=count),), cuda_major=cuda)
    return choose(view, demand, Unclaimed(), granularity=granularity)


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_a_cordoned_server_is_refused_as_server_cordoned(make: Make, granularity) -> None:
    decision = _decide(make, _cordon(make.server("gpu-a"), node=True), granularity=granularity)
    assert isinstance(decision, Refusal)
    assert decision.nofit.message == "4/4 ServerCordoned"
    assert "cordoned" in decision.nofit.servers[0].detail


def test_the_next_server_is_chosen_when_the_best_fit_is_cordoned(make: Make) -> None:
    small = _cordon(make.server("gpu-a", cards=2), node=True)
    decision = _decide(make, small, make.server("gpu-b"))
    assert isinstance(decision, Choice) and decision.fit.facts.name == "gpu-b"


def test_card_granularity_skips_cordoned_cards_and_books_the_others(make: Make) -> None:
    server = _cordon(make.server("gpu-a"), 0, 1)
    decision = _decide(make, server, granularity="card", count=2)
    assert isinstance(decision, Choice)
    assert [c.index for c in decision.fit.cards] == [2, 3]


def test_card_granularity_counts_cordoned_cards_as_card_cordoned(make: Make) -> None:
    server = _cordon(make.server("gpu-a"), 0, 1, 2)
    decision = _decide(make, server, granularity="card", count=2)
    assert isinstance(decision, Refusal)
    assert decision.nofit.message == render_reasons(
        {Reason.CARD_CORDONED: 3, Reason.NODE_INSUFFICIENT_DEVICE: 1}, 4
    )


def test_server_granularity_never_books_a_server_with_a_cordoned_card(make: Make) -> None:
    decision = _decide(make, _cordon(make.server("gpu-a"), 3))
    assert isinstance(decision, Refusal)
    assert decision.nofit.message == "4/4 ServerCordoned"
    assert "GPU-gpu-a-3" in decision.nofit.servers[0].detail


def test_a_cordoned_server_is_not_worth_preempting_for(make: Make) -> None:
    # Only claims would keep the pod from it otherwise: a cordon must not look that way.
    held = _cordon(make.server("gpu-a"), node=True)
    decision = _decide(make, held)
    assert isinstance(decision, Refusal) and decision.blocked_by_claims == ()


def _versioned(make: Make, name: str, version: str | None) -> Server:
    return dataclasses.replace(make.server(name), cuda_version=version)


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_a_pod_asking_for_a_cuda_major_gets_a_server_reporting_it(make: Make, granularity) -> None:
    servers = (_versioned(make, "gpu-a", "11.8"), _versioned(make, "gpu-b", "12.4"))
    decision = _decide(make, *servers, granularity=granularity, cuda=12)
    assert isinstance(decision, Choice) and decision.fit.facts.name == "gpu-b"


@pytest.mark.parametrize("version", ["11.8", None])
def test_other_and_unknown_cuda_versions_are_refused_as_cuda_version_mismatch(
    make: Make, version: str | None
) -> None:
    decision = _decide(make, _versioned(make, "gpu-a", version), cuda=12)
    assert isinstance(decision, Refusal)
    assert decision.nofit.message == "4/4 CudaVersionMismatch"
    detail = decision.nofit.servers[0].detail
    assert ("11.8" in detail) if version else ("not known" in detail)


def test_a_pod_without_a_cuda_major_takes_any_version(make: Make) -> None:
    decision = _decide(make, _versioned(make, "gpu-a", None))
    assert isinstance(decision, Choice)
