"""Container assignment and the Binding annotations rendered from a claim."""

from __future__ import annotations

import pytest

from rgpu_allocator.annotations import ANNOTATION_VISIBLE_DEVICES, binding_annotations
from rgpu_allocator.errors import CardsGone
from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_ENDPOINT,
    ANNOTATION_TO_ALLOCATE,
    CardId,
    Claim,
    ClaimState,
    ContainerAssignment,
    ServerName,
    decode_devices,
)
from rgpu_placement import assign


def containers(build):
    return (
        build.container("init", 2, kind="init"),
        build.container("side", 1, kind="sidecar"),
        build.container("plain", 0),
        build.container("main", 2),
    )


def test_server_mode_gives_each_requesting_container_every_card(build):
    cards = build.server("a", cards=3).cards
    out = assign(containers(build), tuple(reversed(cards)), "server")
    ids = tuple(c.id for c in cards)
    assert [(a.name, a.cards) for a in out] == [
        ("init", ids),
        ("side", ids),
        ("plain", ()),
        ("main", ids),
    ]


def test_card_mode_gives_disjoint_cards_and_init_reuses_them(build):
    cards = build.server("a", cards=3).cards
    out = assign(containers(build), cards, "card")
    ids = [c.id for c in cards]
    assert [(a.name, list(a.cards)) for a in out] == [
        ("init", ids[:2]),
        ("side", ids[:1]),
        ("plain", []),
        ("main", ids[1:3]),
    ]


def claim_for(build, granularity):
    server = build.server("gpu-a", cards=2, memory=[40000, 80000])
    parts = assign(containers(build), server.cards, granularity)
    picked = tuple(c.id for c in server.cards)
    made = Claim(
        pod=build.pod(),
        server=ServerName("gpu-a"),
        cards=picked,
        containers=parts,
        state=ClaimState.COMMITTED,
        booked_at=1.0,
    )
    return made, {c.id: c for c in server.cards}


def test_binding_annotations_follow_the_hami_codec_in_pod_order(build):
    made, cards = claim_for(build, "server")
    out = dict(
        binding_annotations(made, endpoint="10.0.0.5:14833", cards=cards, granularity="server")
    )
    u0, u1 = build.uuid("gpu-a", 0), build.uuid("gpu-a", 1)
    both = f"gpu-a/{u0},RemoteGPU,40000,100:gpu-a/{u1},RemoteGPU,80000,100:"
    assert out[ANNOTATION_TO_ALLOCATE] == f"{both};{both};;{both};"
    assert out[ANNOTATION_ALLOCATED] == out[ANNOTATION_TO_ALLOCATE]
    assert out[ANNOTATION_ENDPOINT] == "10.0.0.5:14833"
    assert ANNOTATION_VISIBLE_DEVICES not in out
    assert len(decode_devices(out[ANNOTATION_ALLOCATED])) == 4


def test_card_mode_adds_visible_devices(build):
    made, cards = claim_for(build, "card")
    out = dict(binding_annotations(made, endpoint="e:1", cards=cards, granularity="card"))
    assert out[ANNOTATION_VISIBLE_DEVICES] == f"{build.uuid('gpu-a', 0)},{build.uuid('gpu-a', 1)}"


def test_card_missing_from_the_fleet_is_a_conflict_naming_the_card(build):
    made = Claim(
        pod=build.pod(),
        server=ServerName("gpu-a"),
        cards=(CardId("gpu-a/GPU-gone"),),
        containers=(ContainerAssignment(name="main", cards=(CardId("gpu-a/GPU-gone"),)),),
        state=ClaimState.BOOKED,
        booked_at=1.0,
    )
    with pytest.raises(CardsGone, match="gpu-a/GPU-gone"):
        binding_annotations(made, endpoint="e:1", cards={}, granularity="server")
