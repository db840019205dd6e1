"""The choice rules of docs/design.md#choosing-a-server in both granularities, as pure functions
over a fleet."""

from __future__ import annotations

import pytest

from rgpu_contracts import CardId, Claim, render_reasons, split_card_id
from rgpu_placement import (
    Choice,
    FleetView,
    Holdings,
    Refusal,
    ServerFacts,
    Unclaimed,
    choose,
    demand_of,
)

KEYS = ("topology.rgpu.io/rack", "topology.kubernetes.io/zone", "topology.kubernetes.io/region")


class Held:
    """Holdings where the given servers' cards are claimed by another running pod."""

    def __init__(self, make, held: dict[str, tuple[int, ...]], problem: str | None = None) -> None:
        # An unreadable Lease has no claims, only its problem.
        self._claims = {
            server: () if problem else (make.claim(server, idx, pod="holder"),)
            for server, idx in held.items()
        }
        self._problem = problem

    def blocking(self, server: str) -> tuple[Claim, ...]:
        return self._claims.get(server, ())

    def problem(self, server: str) -> str | None:
        return self._problem if server in self._claims else None

    def taken(self, server: str) -> frozenset[CardId]:
        return frozenset(card for claim in self.blocking(server) for card in claim.cards)

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return facts.busy

    def without_claims(self) -> Holdings:
        return ClaimsGone(self)


class ClaimsGone(Unclaimed):
    """``Held`` with its claims gone: lupine's reports of the claimed cards go too."""

    def __init__(self, held: Held) -> None:
        self._held = held

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        gone = {split_card_id(card)[1] for card in self._held.taken(facts.name)}
        return facts.busy - gone


def decide(
    make,
    servers,
    *containers,
    held=None,
    granularity="server",
    candidates=(),
    topo=None,
    nominated=None,
):
    view = FleetView.build(make.fleet(*servers), topo, KEYS)
    demand = demand_of(containers or (make.container(),))
    return choose(
        view,
        demand,
        held or Unclaimed(),
        candidates=tuple(candidates),
        granularity=granularity,
        nominated=nominated,
    )


def chosen(result) -> str:
    assert isinstance(result, Choice), getattr(result, "nofit", result)
    return result.fit.facts.name


def refused(result) -> str:
    assert isinstance(result, Refusal), result
    return result.nofit.message


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_not_ready_server_is_never_chosen(make, granularity):
    result = decide(
        make, [make.server("a", ready=False), make.server("b")], granularity=granularity
    )
    assert chosen(result) == "b"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_unreachable_server_is_refused_with_server_unreachable(make, granularity):
    result = decide(make, [make.server("a", reachable=False)], granularity=granularity)
    assert refused(result) == "4/4 ServerUnreachable"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_server_without_endpoint_is_refused_as_not_ready(make, granularity):
    result = decide(make, [make.server("a", endpoint=None)], granularity=granularity)
    assert refused(result) == "4/4 ServerNotReady"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_server_with_no_healthy_card_is_refused_card_not_health(make, granularity):
    result = decide(make, [make.server("a", cards=2, unhealthy=(0, 1))], granularity=granularity)
    assert refused(result) == "2/2 CardNotHealth, 1/2 NodeInsufficientDevice"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_the_nominated_server_is_chosen_over_a_better_one(make, granularity):
    servers = [make.server("a"), make.server("b")]
    assert chosen(decide(make, servers, granularity=granularity)) == "a"
    assert chosen(decide(make, servers, granularity=granularity, nominated="b")) == "b"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_a_held_nominated_server_refuses_the_pod_though_another_fits(make, granularity):
    servers = [make.server("a"), make.server("b")]
    held = Held(make, {"b": (0, 1, 2, 3)})
    result = decide(make, servers, held=held, granularity=granularity, nominated="b")
    assert isinstance(result, Refusal)
    assert [v.server for v in result.nofit.servers] == ["b"]
    assert "waits for this server while its victims leave" in result.nofit.servers[0].detail
    assert result.blocked_by_claims == ("b",)


def test_a_nominated_server_gone_from_the_fleet_holds_nobody(make):
    servers = [make.server("a"), make.server("b")]
    assert chosen(decide(make, servers, nominated="gone")) == "a"


def test_empty_fleet_is_refused_with_no_servers(make):
    assert refused(decide(make, [])) == "0/0 NoServers"


def test_server_mode_gives_the_pod_every_healthy_card(make):
    result = decide(make, [make.server("a", cards=4, unhealthy=(2,))])
    assert isinstance(result, Choice)
    assert [c.index for c in result.fit.cards] == [0, 1, 3]


def test_server_mode_refuses_a_server_with_any_card_claimed(make):
    held = Held(make, {"a": (0,)})
    result = decide(make, [make.server("a", cards=2)], held=held)
    assert refused(result) == "2/2 ExclusiveDeviceAllocateConflict"
    assert result.blocked_by_claims == ("a",)


def test_server_mode_refuses_a_server_with_a_busy_card(make):
    result = decide(make, [make.server("a", cards=2, busy=(1,)), make.server("b", cards=8)])
    assert chosen(result) == "b"
    alone = decide(make, [make.server("a", cards=2, busy=(1,))])
    assert refused(alone) == "2/2 CardBusyOnServer"
    assert alone.blocked_by_claims == ()


def test_server_mode_checks_each_container_on_its_own(make):
    # Two containers of 2 cards each: a collapsed request would need 4; each alone needs 2.
    servers = [make.server("a", cards=2)]
    result = decide(make, servers, make.container("x", 2), make.container("y", 2))
    assert chosen(result) == "a"


def test_server_mode_checks_memory_per_container(make):
    # One container wants 2 big cards, another 1 small one; only b has two big cards.
    servers = [
        make.server("a", memory=[80000, 20000, 20000, 20000]),
        make.server("b", memory=[80000, 80000, 20000, 20000]),
    ]
    result = decide(
        make, servers, make.container("big", 2, 60000), make.container("small", 1, 10000)
    )
    assert chosen(result) == "b"


def test_server_mode_memory_is_a_filter_with_hami_reasons(make):
    result = decide(make, [make.server("a", memory=[80000, 20000])], make.container("m", 2, 40000))
    assert refused(result) == "1/2 CardInsufficientMemory, 1/2 NodeInsufficientDevice"


def test_server_mode_counts_too_few_cards_as_node_insufficient_device(make):
    result = decide(
        make, [make.server("a", cards=2), make.server("b", cards=1)], make.container(count=3)
    )
    assert refused(result) == "2/3 NodeInsufficientDevice"


def test_server_mode_init_sidecar_and_app_are_each_checked(make):
    servers = [make.server("a", cards=2)]
    containers = (
        make.container("init", 2, kind="init"),
        make.container("side", 2, kind="sidecar"),
        make.container("main", 2),
    )
    assert chosen(decide(make, servers, *containers)) == "a"
    too_big = (make.container("init", 3, kind="init"), make.container("main", 1))
    assert refused(decide(make, servers, *too_big)) == "1/2 NodeInsufficientDevice"


def test_card_mode_uses_the_effective_count(make):
    servers = [make.server("a", cards=3), make.server("b", cards=4)]
    containers = (
        make.container("init", 3, kind="init"),
        make.container("side", 1, kind="sidecar"),
        make.container("main", 3),
    )
    # max(3, 1 + 3) = 4 cards on one server: only b.
    result = decide(make, servers, *containers, granularity="card")
    assert chosen(result) == "b"
    assert len(result.fit.cards) == 4


def test_card_mode_never_spans_servers(make):
    servers = [make.server("a", cards=2), make.server("b", cards=2)]
    result = decide(make, servers, make.container(count=3), granularity="card")
    assert refused(result) == "2/4 NodeInsufficientDevice"


def test_card_mode_skips_claimed_busy_and_unhealthy_cards(make):
    held = Held(make, {"a": (0,)})
    server = make.server("a", cards=4, unhealthy=(1,), busy=(2,))
    result = decide(make, [server], make.container(count=1), held=held, granularity="card")
    assert [c.index for c in result.fit.cards] == [3]
    refusal = decide(make, [server], make.container(count=2), held=held, granularity="card")
    assert refused(refusal) == (
        "1/4 CardBusyOnServer, 1/4 CardNotHealth, 1/4 ExclusiveDeviceAllocateConflict, "
        "1/4 NodeInsufficientDevice"
    )


def test_card_mode_every_card_meets_the_largest_memory_request(make):
    server = make.server("a", memory=[80000, 80000, 20000, 20000])
    containers = (make.container("x", 1, 60000), make.container("y", 2, 1000))
    refusal = decide(make, [server], *containers, granularity="card")
    assert refused(refusal) == "2/4 CardInsufficientMemory, 1/4 NodeInsufficientDevice"
    ok = decide(
        make, [server], make.container("x", 1, 60000), make.container("y", 1), granularity="card"
    )
    assert {c.memory_mib for c in ok.fit.cards} == {80000}


def test_card_mode_prefers_the_tightest_fit(make):
    held = Held(make, {"big": (0, 1, 2, 3, 4)})
    servers = [make.server("big", cards=8), make.server("small", cards=4)]
    result = decide(make, servers, make.container(count=2), held=held, granularity="card")
    assert chosen(result) == "big"  # 3 free cards beat 4


def test_server_mode_prefers_fewest_cards_then_name(make):
    servers = [make.server("c", cards=4), make.server("b", cards=2), make.server("a", cards=2)]
    assert chosen(decide(make, servers)) == "a"


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_locality_beats_best_fit(make, granularity):
    servers = [
        make.server("small", cards=1, labels={KEYS[1]: "z1"}),
        make.server("near", cards=8, labels={KEYS[0]: "r2", KEYS[1]: "z2"}),
        make.server("zone", cards=2, labels={KEYS[0]: "r9", KEYS[1]: "z2"}),
    ]
    topo = make.topology({"n1": {KEYS[0]: "r2", KEYS[1]: "z2"}, "n2": {KEYS[1]: "z2"}})
    result = decide(make, servers, candidates=["n1", "n2"], topo=topo, granularity=granularity)
    assert chosen(result) == "near"
    assert result.tier == 0
    far = decide(make, servers, candidates=["n2"], topo=topo, granularity=granularity)
    assert chosen(far) == "zone"
    assert far.tier == 1
    none = decide(make, servers, candidates=["unknown"], topo=topo, granularity=granularity)
    assert chosen(none) == "small"
    assert none.tier == len(KEYS)


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_one_view_ranks_each_set_of_candidates_by_its_own_domains(make, granularity):
    servers = [
        make.server("a-far", cards=1),
        make.server("b-rack-1", cards=8, labels={KEYS[0]: "r1", KEYS[1]: "z1"}),
        make.server("c-rack-2", cards=8, labels={KEYS[0]: "r2", KEYS[1]: "z1"}),
    ]
    topo = make.topology(
        {
            "n1": {KEYS[0]: "r1", KEYS[1]: "z1"},
            "n1-twin": {KEYS[0]: "r1", KEYS[1]: "z1"},
            "n2": {KEYS[0]: "r2", KEYS[1]: "z1"},
        }
    )
    view = FleetView.build(make.fleet(*servers), topo, KEYS)
    demand = demand_of((make.container(),))
    held = Held(make, {"b-rack-1": (0,)})

    def pick(*candidates: str, holdings: Holdings = Unclaimed()) -> tuple[str, int]:
        result = choose(view, demand, holdings, candidates=candidates, granularity=granularity)
        return chosen(result), result.tier

    # Asked again and again, in any order and with nodes standing for the same domains, the
    # view answers as a fresh one would: rankings are per set of domains, not per call.
    for _ in range(2):
        assert pick("n1") == pick("n1-twin", "n1") == ("b-rack-1", 0)
        assert pick("n2") == ("c-rack-2", 0)
        assert pick("n1", "n2") == ("b-rack-1", 0)
        assert pick("unknown") == ("a-far", len(KEYS))
        assert pick("n1", holdings=held) == (
            ("b-rack-1", 0) if granularity == "card" else ("c-rack-2", 1)
        )


class HeldBy(Held):
    """Every server held by the pod ``holder``, with lupine's reports as given."""

    def __init__(self, make, servers, holder: str, busy: dict[str, frozenset[str]]) -> None:
        self._claims = {s: (make.claim(s, (0, 1), pod=holder),) for s in servers}
        self._problem = None
        self._busy = busy

    def busy(self, facts: ServerFacts) -> frozenset[str]:
        return self._busy.get(facts.name, frozenset())


def test_repeated_refusals_on_one_view_explain_the_holdings_of_each_moment(make):
    servers = [make.server(name, cards=2) for name in ("a", "b")]
    view = FleetView.build(make.fleet(*servers), None, KEYS)
    demand = demand_of((make.container(),))
    gpu = servers[1].cards[0].uuid

    def details(holder: str, busy: dict[str, frozenset[str]]) -> list[str]:
        result = choose(view, demand, HeldBy(make, ("a",), holder, busy))
        assert isinstance(result, Refusal), result
        return [v.detail for v in result.nofit.servers]

    busy_b = {"b": frozenset({gpu})}
    reported = f"lupine reports clients on {gpu}"
    assert details("first", busy_b) == ["held by team-a/first", reported]
    assert details("second", busy_b) == ["held by team-a/second", reported]
    assert details("first", busy_b) == ["held by team-a/first", reported]
    assert chosen(choose(view, demand, HeldBy(make, ("a",), "first", {}))) == "b"


def test_choice_is_deterministic_whatever_the_fleet_order(make):
    servers = [make.server(f"s{i}", cards=2 + i % 3) for i in range(30)]
    first = chosen(decide(make, servers))
    assert all(chosen(decide(make, list(reversed(servers)))) == first for _ in range(3))


def test_unreadable_lease_counts_as_fully_held(make):
    held = Held(make, {"a": ()}, problem="not JSON")  # an unreadable Lease has no claims
    result = decide(make, [make.server("a", cards=2)], held=held, granularity="card")
    assert refused(result) == "2/2 ExclusiveDeviceAllocateConflict"
    assert "not JSON" in result.nofit.servers[0].detail


def test_reasons_render_like_hami(make):
    servers = [
        make.server("a", cards=2, ready=False),
        make.server("b", cards=2, unhealthy=(0,)),
        make.server("c", cards=2, reachable=False),
    ]
    result = decide(make, servers, make.container(count=2))
    nofit = result.nofit
    assert nofit.total == 6
    assert nofit.message == render_reasons(nofit.reasons, 6)
    assert nofit.message == (
        "1/6 CardNotHealth, 1/6 NodeInsufficientDevice, 2/6 ServerNotReady, 2/6 ServerUnreachable"
    )
    assert [v.server for v in nofit.servers] == ["a", "b", "c"]


def test_blocked_servers_are_listed_in_preference_order(make):
    held = Held(make, {"a": (0,), "b": (0,)})
    servers = [make.server("a", cards=4), make.server("b", cards=2)]
    result = decide(make, servers, held=held)
    assert result.blocked_by_claims == ("b", "a")


@pytest.mark.parametrize("granularity", ["server", "card"])
def test_servers_only_busy_reports_block_are_listed_best_first(make, granularity):
    servers = [make.server("big", cards=8, busy=range(8)), make.server("a", busy=range(4))]
    result = decide(make, servers, granularity=granularity)
    assert isinstance(result, Refusal)
    assert result.blocked_by_busy == ("a", "big")
    assert result.blocked_by_claims == ()


def test_busy_server_also_held_by_a_claim_is_not_listed_as_blocked_by_busy(make):
    servers = [make.server("a", busy=(0,)), make.server("b", cards=2, busy=(1,))]
    result = decide(make, servers, held=Held(make, {"a": (1,)}))
    assert isinstance(result, Refusal)
    assert result.blocked_by_busy == ("b",)


def test_busy_server_too_small_anyway_is_not_listed_as_blocked_by_busy(make):
    servers = [make.server("a", cards=1, busy=(0,))]
    result = decide(make, servers, make.container(count=2))
    assert isinstance(result, Refusal)
    assert result.blocked_by_busy == ()


def test_view_with_fresh_servers_replaces_only_those_servers(make):
    view = FleetView.build(make.fleet(make.server("a", busy=(0,)), make.server("b")), None, KEYS)
    fresh = view.with_servers([make.server("a"), make.server("elsewhere")])
    assert fresh.facts["a"].busy == frozenset()
    # An unchanged server keeps its facts: a fresh state costs the servers that changed.
    assert fresh.facts["b"] is view.facts["b"]
    assert set(fresh.facts) == {"a", "b"}
    assert view.facts["a"].busy and fresh.fleet.revision == view.fleet.revision
