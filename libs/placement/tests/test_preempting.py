"""The choice of the cheapest server to free for an urgent pod (docs/design.md §11), both
granularities."""

from __future__ import annotations

import json

import pytest

from rgpu_contracts import CardId, Claim, ContractError, PodRef, PodUID, ServerName
from rgpu_placement import (
    FleetView,
    Holdings,
    Nomination,
    ServerFacts,
    Standing,
    Unclaimed,
    demand_of,
    preemptions,
)

KEYS = ("topology.rgpu.io/rack",)


class Holders:
    """Holdings from explicit claims; ``standing`` gives each holder pod's priority and age."""

    def __init__(self, claims: list[Claim], standing: dict[str, tuple[int, float]]) -> None:
        self._claims = claims
        self._standing = standing

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return tuple(c for c in self._claims if c.server == server)

    def problem(self, server: str) -> str | None:
        return None

    def taken(self, server: str) -> frozenset[CardId]:
        return frozenset(card for c in self.blocking(server) for card in c.cards)

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return facts.busy

    def without_claims(self) -> Holdings:
        return Unclaimed()

    def standing(self, claim: Claim) -> Standing | None:
        found = self._standing.get(claim.pod.name)
        return Standing(priority=found[0], run_seconds=found[1]) if found else None


def run(make, servers, held: Holders, *, priority=100, count=1, granularity="server"):
    view = FleetView.build(make.fleet(*servers), None, KEYS)
    demand = demand_of((make.container(count=count),))
    return preemptions(
        view,
        demand,
        held,
        priority=priority,
        standing=held.standing,
        granularity=granularity,
    )


def names(options) -> list[tuple[str, list[str]]]:
    return [(o.server, [v.pod.name for v in o.victims]) for o in options]


def test_a_pod_without_priority_never_preempts(make):
    held = Holders([make.claim("a", (0,), pod="low")], {"low": (-5, 10.0)})
    assert run(make, [make.server("a")], held, priority=0) == ()


def test_holders_of_equal_or_higher_priority_are_never_victims(make):
    claims = [make.claim("a", (0,), pod="same"), make.claim("b", (0,), pod="higher")]
    held = Holders(claims, {"same": (100, 1.0), "higher": (200, 1.0)})
    assert run(make, [make.server("a"), make.server("b")], held) == ()


def test_a_holder_of_unknown_priority_is_never_a_victim(make):
    held = Holders([make.claim("a", (0,), pod="stranger")], {})
    assert run(make, [make.server("a")], held) == ()


def test_server_mode_frees_the_server_with_the_fewest_victims_first(make):
    claims = [
        make.claim("a", (0,), pod="a1"),
        make.claim("a", (1,), pod="a2"),
        make.claim("b", (0, 1, 2, 3), pod="b1"),
    ]
    held = Holders(claims, {"a1": (1, 1.0), "a2": (1, 1.0), "b1": (50, 900.0)})
    options = run(make, [make.server("a"), make.server("b")], held)
    assert names(options) == [("b", ["b1"]), ("a", ["a1", "a2"])]


def test_server_mode_keeps_a_server_whose_any_holder_outranks_the_pod(make):
    claims = [make.claim("a", (0,), pod="low"), make.claim("a", (1,), pod="vip")]
    held = Holders(claims, {"low": (1, 1.0), "vip": (1000, 1.0)})
    assert run(make, [make.server("a")], held) == ()


def test_ties_go_to_the_lowest_priority_then_least_run_time_then_name(make):
    servers = [make.server(n) for n in ("a", "b", "c", "d")]
    claims = [make.claim(s, (0,), pod=f"{s}-pod") for s in ("a", "b", "c", "d")]
    standing = {"a-pod": (10, 5.0), "b-pod": (5, 500.0), "c-pod": (5, 50.0), "d-pod": (5, 50.0)}
    options = run(make, servers, Holders(claims, standing))
    assert [o.server for o in options] == ["c", "d", "b", "a"]
    assert (options[0].max_priority, options[0].run_lost) == (5, 50.0)


def test_a_server_too_small_for_the_pod_is_never_freed(make):
    held = Holders([make.claim("a", (0,), pod="low")], {"low": (1, 1.0)})
    assert run(make, [make.server("a", cards=2)], held, count=4) == ()


def test_the_victims_busy_reports_do_not_keep_the_server(make):
    # lupine reports the victim's card busy; with the victim gone that report is its own.
    held = Holders([make.claim("a", (0,), pod="low")], {"low": (1, 1.0)})
    options = run(make, [make.server("a", busy=(0,))], held)
    assert names(options) == [("a", ["low"])]


def test_card_mode_frees_just_enough_cards(make):
    claims = [
        make.claim("a", (0,), pod="one"),
        make.claim("a", (1, 2), pod="two"),
        make.claim("a", (3,), pod="three"),
    ]
    standing = {"one": (1, 1.0), "two": (1, 1.0), "three": (1, 1.0)}
    options = run(make, [make.server("a")], Holders(claims, standing), count=2, granularity="card")
    assert names(options) == [("a", ["two"])]
    assert {c.index for c in options[0].fit.cards} == {1, 2}


def test_card_mode_uses_free_cards_before_evicting_more(make):
    claims = [make.claim("a", (0,), pod="one"), make.claim("a", (1,), pod="two")]
    standing = {"one": (3, 1.0), "two": (2, 1.0)}
    servers = [make.server("a", cards=3)]
    options = run(make, servers, Holders(claims, standing), count=2, granularity="card")
    assert names(options) == [("a", ["two"])]


def test_card_mode_never_evicts_a_holder_that_outranks_the_pod(make):
    claims = [make.claim("a", (0, 1), pod="vip"), make.claim("a", (2, 3), pod="low")]
    standing = {"vip": (500, 1.0), "low": (1, 1.0)}
    options = run(make, [make.server("a")], Holders(claims, standing), count=3, granularity="card")
    assert options == ()


def nomination(**overrides) -> Nomination:
    fields = {
        "pod": PodRef(uid=PodUID("uid-urgent"), namespace="ml", name="urgent"),
        "priority": 100,
        "cards": (CardId("a/GPU-a-0"),),
        "victims": (PodRef(uid=PodUID("uid-low"), namespace="ml", name="low"),),
        "nominated_at": 10.0,
        "expires_at": 70.0,
    }
    return Nomination(**{**fields, **overrides})


def test_a_nomination_round_trips_through_its_wire_form():
    made = nomination()
    assert Nomination.from_dict(json.loads(json.dumps(made.to_dict()))) == made


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("priority", "high", "nomination.priority"),
        ("priority", True, "nomination.priority"),
        ("expiresAt", None, "nomination.expiresAt"),
        ("cards", ["ok", 3], "nomination.cards[1]"),
        ("victims", [{"uid": ""}], "nomination.victims[0]"),
    ],
)
def test_a_bad_nomination_names_the_field(field, value, path):
    raw = {**nomination().to_dict(), field: value}
    with pytest.raises(ContractError) as caught:
        Nomination.from_dict(raw)
    assert caught.value.path.startswith(path)


def test_a_nomination_holds_against_lower_and_equal_priority_until_it_expires():
    made = nomination()
    assert made.holds_against("uid-other", 100, now=20.0)
    assert made.holds_against("uid-other", 5, now=69.9)
    assert not made.holds_against("uid-other", 101, now=20.0)
    assert not made.holds_against("uid-urgent", 100, now=20.0)
    assert not made.holds_against("uid-other", 5, now=70.0)


def test_a_nomination_reads_as_the_nominee_holding_its_cards():
    claim = nomination().as_claim(ServerName("a"))
    assert (claim.pod.name, claim.server, claim.cards) == ("urgent", "a", ("a/GPU-a-0",))
