"""Which of several claims wins: the most advanced state, then a stable tie-break."""

from __future__ import annotations

from rgpu_contracts import ClaimState
from rgpu_placement import precedence, state_rank, winner


def test_states_rank_bound_then_committed_then_booked() -> None:
    ranks = [state_rank(s) for s in (ClaimState.BOUND, ClaimState.COMMITTED, ClaimState.BOOKED)]
    assert ranks == sorted(ranks)
    assert len(set(ranks)) == 3


def test_the_most_advanced_claim_of_a_pod_wins_whatever_the_order(make) -> None:
    booked = make.claim("gpu-a", [0], state="booked")
    committed = make.claim("gpu-b", [0], state="committed")
    for claims in ([booked, committed], [committed, booked]):
        assert winner(claims) == committed


def test_claims_in_one_state_are_decided_by_server_name(make) -> None:
    on_b = make.claim("gpu-b", [0], state="booked")
    on_a = make.claim("gpu-a", [0], state="booked")
    assert winner([on_b, on_a]) == on_a
    assert precedence(on_a) < precedence(on_b)


def test_no_claims_have_no_winner() -> None:
    assert winner([]) is None
