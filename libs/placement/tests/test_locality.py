"""The one locality rule (docs/design.md#choosing-a-server): nested domains, used for choosing and
for scoring."""

from __future__ import annotations

import random

import pytest

from rgpu_contracts import NodeName
from rgpu_placement import Choice, Unclaimed, choose, demand_of, shared_level, tiers

RACK, ZONE, REGION = (
    "topology.rgpu.io/rack",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
)
KEYS = (RACK, ZONE, REGION)

CLIENT = {RACK: "r1", ZONE: "a", REGION: "eu"}
SAME_RACK_NAME_OTHER_ZONE = {RACK: "r1", ZONE: "b", REGION: "eu"}
OTHER_RACK_SAME_ZONE = {RACK: "r2", ZONE: "a", REGION: "eu"}


@pytest.mark.parametrize(
    ("server", "level"),
    [
        ({RACK: "r1", ZONE: "a", REGION: "eu"}, 0),
        (OTHER_RACK_SAME_ZONE, 1),
        (SAME_RACK_NAME_OTHER_ZONE, 2),
        ({RACK: "r1", ZONE: "a", REGION: "us"}, None),
        ({RACK: "r1"}, 0),
        ({ZONE: "a"}, 1),
        ({}, None),
    ],
)
def test_shared_level_is_the_finest_domain_whose_coarser_domains_agree(server, level) -> None:
    assert shared_level(server, CLIENT, KEYS) == level


def test_a_coarser_label_missing_on_one_side_does_not_veto_a_finer_match() -> None:
    assert shared_level({RACK: "r1", ZONE: "a"}, {RACK: "r1"}, KEYS) == 0


def test_shared_level_is_symmetric() -> None:
    for other in (SAME_RACK_NAME_OTHER_ZONE, OTHER_RACK_SAME_ZONE, {RACK: "r1"}):
        assert shared_level(other, CLIENT, KEYS) == shared_level(CLIENT, other, KEYS)


def test_tiers_rank_a_same_named_rack_in_another_zone_below_the_own_zone(make) -> None:
    view = make.view(
        [
            make.server("far", labels=SAME_RACK_NAME_OTHER_ZONE),
            make.server("near", labels=OTHER_RACK_SAME_ZONE),
        ],
        nodes={"client-1": CLIENT},
    )
    assert tiers(view, (NodeName("client-1"),)) == {"near": 1, "far": 2}


def test_tiers_take_the_best_tier_over_every_candidate(make) -> None:
    view = make.view(
        [make.server("s", labels=SAME_RACK_NAME_OTHER_ZONE)],
        nodes={"client-1": CLIENT, "client-2": {RACK: "r1", ZONE: "b"}},
    )
    assert tiers(view, (NodeName("client-1"), NodeName("client-2"))) == {"s": 0}


def test_tiers_without_candidates_or_labels_are_empty(make) -> None:
    view = make.view([make.server("s", labels=CLIENT)], nodes={"client-1": {}})
    assert tiers(view, ()) == {}
    assert tiers(view, (NodeName("client-1"), NodeName("unknown"))) == {}


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_a_client_in_zone_a_rack_r1_gets_zone_a_rack_r2_not_zone_b_rack_r1(
    make, granularity
) -> None:
    view = make.view(
        [
            # Smaller, so best fit alone would pick it: locality must decide first.
            make.server("zone-b-r1", cards=1, labels=SAME_RACK_NAME_OTHER_ZONE),
            make.server("zone-a-r2", cards=4, labels=OTHER_RACK_SAME_ZONE),
        ],
        nodes={"client-1": CLIENT},
    )
    demand = demand_of((make.container(count=1),))
    result = choose(
        view,
        demand,
        Unclaimed(),
        candidates=(NodeName("client-1"),),
        granularity=granularity,
    )
    assert isinstance(result, Choice)
    assert (result.fit.facts.name, result.tier) == ("zone-a-r2", 1)


def test_tiers_agree_with_the_best_shared_level_over_the_candidates(make) -> None:
    # Random labels, some missing on either side, some rack names reused across zones.
    rng = random.Random(7)

    def labels() -> dict[str, str]:
        values = {RACK: f"r{rng.randrange(3)}", ZONE: f"z{rng.randrange(3)}", REGION: "eu"}
        return {k: v for k, v in values.items() if rng.random() > 0.2}

    for _ in range(30):
        servers = [make.server(f"s{i}", labels=labels()) for i in range(12)]
        nodes = {f"n{i}": labels() for i in range(4)}
        view = make.view(servers, nodes=nodes)
        expected: dict[str, int] = {}
        for server in servers:
            levels = [shared_level(dict(server.topology), n, KEYS) for n in nodes.values()]
            known = [level for level in levels if level is not None]
            if known:
                expected[server.name] = min(known)
        assert tiers(view, tuple(NodeName(n) for n in nodes)) == expected
