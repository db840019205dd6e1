"""Update contracts: round trips, what each kind may carry, and applying a delta gives the
value a full answer would."""

from __future__ import annotations

import pytest

from rgpu_contracts import (
    CardId,
    Claim,
    ClaimSet,
    ClaimState,
    ClaimsUpdate,
    ContractError,
    Fleet,
    FleetUpdate,
    PodRef,
    PodUID,
    Server,
    ServerName,
    UpdateKind,
)


def server(name: str, ready: bool = True) -> Server:
    return Server(
        name=ServerName(name),
        endpoint="10.0.0.1:14833",
        port=14833,
        ready=ready,
        reachable=True,
        usage_reported=True,
        busy=frozenset(),
        topology=(),
        cards=(),
    )


def claim(pod: str, on: str) -> Claim:
    return Claim(
        pod=PodRef(uid=PodUID(f"uid-{pod}"), namespace="ml", name=pod),
        server=ServerName(on),
        cards=(CardId(f"{on}/GPU-0"),),
        containers=(),
        state=ClaimState.BOOKED,
        booked_at=1.0,
    )


def test_a_fleet_delta_replaces_adds_and_removes_keeping_the_rest_by_identity() -> None:
    a, b, c = server("a"), server("b"), server("c")
    held = Fleet(revision=5, observed_at=1.0, servers=(a, b, c))
    update = FleetUpdate(
        kind=UpdateKind.DELTA,
        revision=9,
        since=5,
        observed_at=2.0,
        servers=(server("b", ready=False), server("bb")),
        removed=(ServerName("c"),),
    )
    fleet = FleetUpdate.from_dict(update.to_dict()).apply(held)
    assert [s.name for s in fleet.servers] == ["a", "b", "bb"]
    assert fleet.servers[0] is a
    assert (fleet.revision, fleet.observed_at, fleet.servers[1].ready) == (9, 2.0, False)


def test_a_plain_fleet_body_reads_as_a_full_update() -> None:
    fleet = Fleet(revision=3, observed_at=1.0, servers=(server("a"),))
    update = FleetUpdate.from_dict(fleet.to_dict())
    assert update.kind is UpdateKind.FULL
    assert update.apply(None) == fleet
    assert update.to_dict() == {"kind": "full", **fleet.to_dict()}


def test_a_claims_delta_replaces_the_named_servers_claims() -> None:
    held = ClaimSet(revision=10, claims=(claim("p", "a"), claim("q", "b"), claim("r", "c")))
    update = ClaimsUpdate(
        kind=UpdateKind.DELTA,
        revision=12,
        since=10,
        servers=(ServerName("b"), ServerName("c"), ServerName("d")),
        claims=(claim("s", "d"), claim("t", "b")),
    )
    claims = ClaimsUpdate.from_dict(update.to_dict()).apply(held)
    assert [(c.pod.name, c.server) for c in claims.claims] == [("p", "a"), ("t", "b"), ("s", "d")]
    assert claims.revision == 12


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"kind": "partial", "revision": 1}, "kind"),
        ({"kind": "delta", "revision": 1}, "since"),
        ({"kind": "delta", "revision": 1, "since": 4}, "revision"),
        ({"kind": "full", "revision": 1, "servers": [], "removed": ["a"]}, "removed"),
    ],
)
def test_an_impossible_fleet_update_is_a_contract_error(raw: dict[str, object], path: str) -> None:
    with pytest.raises(ContractError) as caught:
        FleetUpdate.from_dict(raw)
    assert caught.value.path == path


def test_a_claims_delta_with_a_claim_of_an_unnamed_server_is_a_contract_error() -> None:
    raw = {"kind": "delta", "revision": 2, "since": 1, "servers": ["a"]}
    raw["claims"] = [claim("p", "b").to_dict()]
    with pytest.raises(ContractError, match="not in servers"):
        ClaimsUpdate.from_dict(raw)


def test_a_behind_answer_or_a_delta_from_another_revision_cannot_be_applied() -> None:
    held = ClaimSet(revision=10, claims=())
    behind = ClaimsUpdate(kind=UpdateKind.BEHIND, revision=8, since=10)
    elsewhere = ClaimsUpdate(kind=UpdateKind.DELTA, revision=12, since=11)
    with pytest.raises(ContractError, match="nothing to apply"):
        behind.apply(held)
    with pytest.raises(ContractError, match="delta is from 11"):
        elsewhere.apply(held)
