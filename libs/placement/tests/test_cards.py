"""One state per card, by documented precedence; HAMi's allocated flag stays independent."""

from __future__ import annotations

import pytest

from rgpu_contracts import ClaimSet
from rgpu_placement import CardState, claims_by_server, holding_claims, view_cards


def test_states_are_declared_in_documented_precedence_order():
    assert [s.value for s in CardState] == [
        "unavailable",
        "unhealthy",
        "bound",
        "committed",
        "booked",
        "busy",
        "free",
    ]


@pytest.mark.parametrize(
    ("server", "claim", "expected"),
    [
        ({"ready": False, "unhealthy": [0], "busy": [0]}, "bound", "unavailable"),
        ({"reachable": False}, "booked", "unavailable"),
        ({"unhealthy": [0], "busy": [0]}, "bound", "unhealthy"),
        ({"busy": [0]}, "bound", "bound"),
        ({"busy": [0]}, "committed", "committed"),
        ({"busy": [0]}, "booked", "booked"),
        ({"busy": [0]}, None, "busy"),
        ({"unhealthy": [0]}, None, "unhealthy"),
        ({}, None, "free"),
    ],
)
def test_the_first_applicable_state_wins(make, server, claim, expected):
    srv = make.server("gpu-a", cards=1, **server)
    claims = [make.claim("gpu-a", [0], state=claim)] if claim else []
    (view,) = view_cards(srv, holding_claims(claims))
    assert view.state == CardState(expected)


@pytest.mark.parametrize(
    ("server", "claimed", "allocated"),
    [
        ({"ready": False}, True, True),
        ({"unhealthy": [0]}, True, True),
        ({"busy": [0]}, False, True),
        ({"unhealthy": [0]}, False, False),
        ({}, False, False),
    ],
)
def test_allocated_means_claimed_or_busy_whatever_the_state(make, server, claimed, allocated):
    srv = make.server("gpu-a", cards=1, **server)
    claims = [make.claim("gpu-a", [0])] if claimed else []
    (view,) = view_cards(srv, holding_claims(claims))
    assert view.allocated is allocated


def test_two_claims_on_one_card_show_the_most_advanced_whatever_their_order(make):
    booked = make.claim("gpu-a", [0], state="booked", pod="late", booked_at=0.5)
    bound = make.claim("gpu-a", [0], state="bound", pod="placed", booked_at=9.0)
    for claims in ([booked, bound], [bound, booked]):
        assert holding_claims(claims)[bound.cards[0]].pod.name == "placed"


def test_two_claims_in_one_state_show_the_older_booking(make):
    old = make.claim("gpu-a", [0], state="booked", pod="old", booked_at=1.0)
    new = make.claim("gpu-a", [0], state="booked", pod="new", booked_at=2.0)
    assert holding_claims([new, old])[old.cards[0]].pod.name == "old"


def test_claims_are_grouped_by_the_server_they_name(make):
    a0 = make.claim("gpu-a", [0], pod="p0")
    a1 = make.claim("gpu-a", [1], pod="p1")
    b0 = make.claim("gpu-b", [0], pod="p2")
    groups = claims_by_server(ClaimSet(revision=1, claims=(a1, b0, a0)))
    assert groups == {"gpu-a": (a0, a1), "gpu-b": (b0,)}
    assert claims_by_server(None) == {}


def test_a_claim_on_cards_of_another_server_leaves_this_server_free(make):
    srv = make.server("gpu-a", cards=1)
    views = view_cards(srv, holding_claims([make.claim("gpu-b", [0])]))
    assert [v.state for v in views] == [CardState.FREE]
