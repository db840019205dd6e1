"""The choice rules of DESIGN §4 in both granularities, as pure functions over a fleet."""

from __future__ import annotations

import pytest

from rgpu_allocator.leases import LeaseRecord
from rgpu_allocator.ledger import Ledger
from rgpu_allocator.occupancy import Occupancy
from rgpu_allocator.pods import PodIndex, PodInfo
from rgpu_contracts import (
    CardId,
    Claim,
    ClaimState,
    PodUID,
    ServerName,
    render_reasons,
)
from rgpu_placement import Choice, FleetView, Refusal, Unclaimed, choose, demand_of

KEYS = ("topology.rgpu.io/rack", "topology.kubernetes.io/zone", "topology.kubernetes.io/region")


def Held(build, held: dict[str, tuple[int, ...]], problem: str | None = None) -> Occupancy:
    """Real holdings where the given servers' cards are claimed by a running pod."""
    holder = build.pod("holder")
    records = [
        LeaseRecord(
            name=f"rgpu-{server}",
            server=ServerName(server),
            resource_version="1",
            claims=()
            if problem
            else (
                Claim(
                    pod=holder,
                    server=ServerName(server),
                    cards=tuple(CardId(f"{server}/{build.uuid(server, i)}") for i in idx),
                    containers=(),
                    state=ClaimState.BOUND,
                    booked_at=0.0,
                ),
            ),
            problem=problem,
        )
        for server, idx in held.items()
    ]
    ledger, pods = Ledger(), PodIndex()
    ledger.replace_all(records)
    pods.put(
        PodInfo(
            uid=holder.uid,
            namespace=holder.namespace,
            name=holder.name,
            node_name="client-1",
            phase="Running",
            scheduler_name="rgpu-scheduler",
            has_allocated=True,
        )
    )
    return Occupancy(ledger.lease, pods, uid=PodUID("uid-p"), now=1.0, ttl=30.0)


def decide(build, servers, *containers, held=None, granularity="server", candidates=(), topo=None):
    view = FleetView.build(build.fleet(*servers), topo, KEYS)
    demand = demand_of(containers or (build.container(),))
    return choose(
        view,
        demand,
        held or Unclaimed(),
        candidates=tuple(candidates),
        granularity=granularity,
    )


def chosen(result) -> str:
    assert isinstance(result, Choice), getattr(result, "nofit", result)
    return result.fit.facts.name


def refused(result) -> str:
    assert isinstance(result, Refusal), result
    return result.nofit.message


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_not_ready_server_is_never_chosen(build, granularity):
    result = decide(
        build, [build.server("a", ready=False), build.server("b")], granularity=granularity
    )
    assert chosen(result) == "b"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_unreachable_server_is_refused_with_server_unreachable(build, granularity):
    result = decide(build, [build.server("a", reachable=False)], granularity=granularity)
    assert refused(result) == "4/4 ServerUnreachable"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_server_without_endpoint_is_refused_as_not_ready(build, granularity):
    result = decide(build, [build.server("a", endpoint=None)], granularity=granularity)
    assert refused(result) == "4/4 ServerNotReady"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_server_with_no_healthy_card_is_refused_card_not_health(build, granularity):
    result = decide(build, [build.server("a", cards=2, unhealthy=(0, 1))], granularity=granularity)
    assert refused(result) == "2/2 CardNotHealth, 1/2 NodeInsufficientDevice"


def test_empty_fleet_is_refused_with_no_servers(build):
    assert refused(decide(build, [])) == "0/0 NoServers"


def test_server_mode_gives_the_pod_every_healthy_card(build):
    result = decide(build, [build.server("a", cards=4, unhealthy=(2,))])
    assert isinstance(result, Choice)
    assert [c.index for c in result.fit.cards] == [0, 1, 3]


def test_server_mode_refuses_a_server_with_any_card_claimed(build):
    held = Held(build, {"a": (0,)})
    result = decide(build, [build.server("a", cards=2)], held=held)
    assert refused(result) == "2/2 ExclusiveDeviceAllocateConflict"
    assert result.blocked_by_claims == ("a",)


def test_server_mode_refuses_a_server_with_a_busy_card(build):
    result = decide(build, [build.server("a", cards=2, busy=(1,)), build.server("b", cards=8)])
    assert chosen(result) == "b"
    alone = decide(build, [build.server("a", cards=2, busy=(1,))])
    assert refused(alone) == "2/2 CardBusyOnServer"
    assert alone.blocked_by_claims == ()


def test_server_mode_checks_each_container_on_its_own(build):
    # Two containers of 2 cards each: a collapsed request would need 4; each alone needs 2.
    servers = [build.server("a", cards=2)]
    result = decide(build, servers, build.container("x", 2), build.container("y", 2))
    assert chosen(result) == "a"


def test_server_mode_checks_memory_per_container(build):
    # One container wants 2 big cards, another 1 small one; only b has two big cards.
    servers = [
        build.server("a", memory=[80000, 20000, 20000, 20000]),
        build.server("b", memory=[80000, 80000, 20000, 20000]),
    ]
    result = decide(
        build, servers, build.container("big", 2, 60000), build.container("small", 1, 10000)
    )
    assert chosen(result) == "b"


def test_server_mode_memory_is_a_filter_with_hami_reasons(build):
    result = decide(
        build, [build.server("a", memory=[80000, 20000])], build.container("m", 2, 40000)
    )
    assert refused(result) == "1/2 CardInsufficientMemory, 1/2 NodeInsufficientDevice"


def test_server_mode_counts_too_few_cards_as_node_insufficient_device(build):
    result = decide(
        build, [build.server("a", cards=2), build.server("b", cards=1)], build.container(count=3)
    )
    assert refused(result) == "2/3 NodeInsufficientDevice"


def test_server_mode_init_sidecar_and_app_are_each_checked(build):
    servers = [build.server("a", cards=2)]
    containers = (
        build.container("init", 2, kind="init"),
        build.container("side", 2, kind="sidecar"),
        build.container("main", 2),
    )
    assert chosen(decide(build, servers, *containers)) == "a"
    too_big = (build.container("init", 3, kind="init"), build.container("main", 1))
    assert refused(decide(build, servers, *too_big)) == "1/2 NodeInsufficientDevice"


def test_card_mode_uses_the_effective_count(build):
    servers = [build.server("a", cards=3), build.server("b", cards=4)]
    containers = (
        build.container("init", 3, kind="init"),
        build.container("side", 1, kind="sidecar"),
        build.container("main", 3),
    )
    # max(3, 1 + 3) = 4 cards on one server: only b.
    result = decide(build, servers, *containers, granularity="card")
    assert chosen(result) == "b"
    assert len(result.fit.cards) == 4


def test_card_mode_never_spans_servers(build):
    servers = [build.server("a", cards=2), build.server("b", cards=2)]
    result = decide(build, servers, build.container(count=3), granularity="card")
    assert refused(result) == "2/4 NodeInsufficientDevice"


def test_card_mode_skips_claimed_busy_and_unhealthy_cards(build):
    held = Held(build, {"a": (0,)})
    server = build.server("a", cards=4, unhealthy=(1,), busy=(2,))
    result = decide(build, [server], build.container(count=1), held=held, granularity="card")
    assert [c.index for c in result.fit.cards] == [3]
    refusal = decide(build, [server], build.container(count=2), held=held, granularity="card")
    assert refused(refusal) == (
        "1/4 CardBusyOnServer, 1/4 CardNotHealth, 1/4 ExclusiveDeviceAllocateConflict, "
        "1/4 NodeInsufficientDevice"
    )


def test_card_mode_every_card_meets_the_largest_memory_request(build):
    server = build.server("a", memory=[80000, 80000, 20000, 20000])
    containers = (build.container("x", 1, 60000), build.container("y", 2, 1000))
    refusal = decide(build, [server], *containers, granularity="card")
    assert refused(refusal) == "2/4 CardInsufficientMemory, 1/4 NodeInsufficientDevice"
    ok = decide(
        build, [server], build.container("x", 1, 60000), build.container("y", 1), granularity="card"
    )
    assert {c.memory_mib for c in ok.fit.cards} == {80000}


def test_card_mode_prefers_the_tightest_fit(build):
    held = Held(build, {"big": (0, 1, 2, 3, 4)})
    servers = [build.server("big", cards=8), build.server("small", cards=4)]
    result = decide(build, servers, build.container(count=2), held=held, granularity="card")
    assert chosen(result) == "big"  # 3 free cards beat 4


def test_server_mode_prefers_fewest_cards_then_name(build):
    servers = [build.server("c", cards=4), build.server("b", cards=2), build.server("a", cards=2)]
    assert chosen(decide(build, servers)) == "a"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_locality_beats_best_fit(build, granularity):
    servers = [
        build.server("small", cards=1, labels={KEYS[1]: "z1"}),
        build.server("near", cards=8, labels={KEYS[0]: "r2", KEYS[1]: "z2"}),
        build.server("zone", cards=2, labels={KEYS[0]: "r9", KEYS[1]: "z2"}),
    ]
    topo = build.topology({"n1": {KEYS[0]: "r2", KEYS[1]: "z2"}, "n2": {KEYS[1]: "z2"}})
    result = decide(build, servers, candidates=["n1", "n2"], topo=topo, granularity=granularity)
    assert chosen(result) == "near"
    assert result.tier == 0
    far = decide(build, servers, candidates=["n2"], topo=topo, granularity=granularity)
    assert chosen(far) == "zone"
    assert far.tier == 1
    none = decide(build, servers, candidates=["unknown"], topo=topo, granularity=granularity)
    assert chosen(none) == "small"
    assert none.tier == len(KEYS)


def test_choice_is_deterministic_whatever_the_fleet_order(build):
    servers = [build.server(f"s{i}", cards=2 + i % 3) for i in range(30)]
    first = chosen(decide(build, servers))
    assert all(chosen(decide(build, list(reversed(servers)))) == first for _ in range(3))


def test_unreadable_lease_counts_as_fully_held(build):
    held = Held(build, {"a": ()}, problem="not JSON")  # an unreadable Lease has no claims
    result = decide(build, [build.server("a", cards=2)], held=held, granularity="card")
    assert refused(result) == "2/2 ExclusiveDeviceAllocateConflict"
    assert "not JSON" in result.nofit.servers[0].detail


def test_reasons_render_like_hami(build):
    servers = [
        build.server("a", cards=2, ready=False),
        build.server("b", cards=2, unhealthy=(0,)),
        build.server("c", cards=2, reachable=False),
    ]
    result = decide(build, servers, build.container(count=2))
    nofit = result.nofit
    assert nofit.total == 6
    assert nofit.message == render_reasons(nofit.reasons, 6)
    assert nofit.message == (
        "1/6 CardNotHealth, 1/6 NodeInsufficientDevice, 2/6 ServerNotReady, 2/6 ServerUnreachable"
    )
    assert [v.server for v in nofit.servers] == ["a", "b", "c"]


def test_blocked_servers_are_listed_in_preference_order(build):
    held = Held(build, {"a": (0,), "b": (0,)})
    servers = [build.server("a", cards=4), build.server("b", cards=2)]
    result = decide(build, servers, held=held)
    assert result.blocked_by_claims == ("b", "a")


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_servers_only_busy_reports_block_are_listed_best_first(build, granularity):
    servers = [build.server("big", cards=8, busy=range(8)), build.server("a", busy=range(4))]
    result = decide(build, servers, granularity=granularity)
    assert isinstance(result, Refusal)
    assert result.blocked_by_busy == ("a", "big")
    assert result.blocked_by_claims == ()


def test_busy_server_also_held_by_a_claim_is_not_listed_as_blocked_by_busy(build):
    servers = [build.server("a", busy=(0,)), build.server("b", cards=2, busy=(1,))]
    result = decide(build, servers, held=Held(build, {"a": (1,)}))
    assert isinstance(result, Refusal)
    assert result.blocked_by_busy == ("b",)


def test_busy_server_too_small_anyway_is_not_listed_as_blocked_by_busy(build):
    servers = [build.server("a", cards=1, busy=(0,))]
    result = decide(build, servers, build.container(count=2))
    assert isinstance(result, Refusal)
    assert result.blocked_by_busy == ()


def test_view_with_fresh_servers_replaces_only_those_servers(build):
    view = FleetView.build(build.fleet(build.server("a", busy=(0,)), build.server("b")), None, KEYS)
    fresh = view.with_servers([build.server("a"), build.server("elsewhere")])
    assert fresh.facts["a"].busy == frozenset()
    assert (
        fresh.facts["b"] is not view.facts["b"]
        and fresh.facts["b"].server == view.facts["b"].server
    )
    assert set(fresh.facts) == {"a", "b"}
    assert view.facts["a"].busy and fresh.fleet.revision == view.fleet.revision
