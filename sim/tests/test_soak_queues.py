"""The queue workload's verdict on recorded evidence: each check passes on a clean record and
fails on the failure it exists to catch — a namespace over its quota, a gang running in part,
a namespace under its share passed over by one above it."""

from __future__ import annotations

from rgpu_kubesim.kubelet import RunRecord
from rgpu_sim.soak_admission import ClaimHistory
from rgpu_sim.soak_evidence import LeaseVersion, NominationSeen, PodLife
from rgpu_sim.soak_fairness import FairInputs, check_fair_share
from rgpu_sim.soak_queues import (
    Holdings,
    QueueSetup,
    check_gangs_whole,
    check_quotas,
    plan_queues,
    queue_problems,
    queue_waits,
)
from rgpu_sim.soak_workload import GANG_LABEL, SoakPod, WorkloadShape, plan_soak_workload
from rgpu_sim.verdict import WakeUp

SETUP = QueueSetup(quotas={"team-a": 2}, weights={"team-a": 1, "team-b": 3})
MEMORY = {f"gpu-0{s}/GPU-{c}": 40960 for s in (1, 2, 3, 4) for c in "ab"}


def _life(
    uid: str, namespace: str = "team-a", *, created: float = 0.0, gang: str = "", priority: int = 0
) -> PodLife:
    return PodLife(
        uid=uid,
        key=f"{namespace}/{uid}",
        created_rv=1,
        created_at=created,
        gated=True,
        priority=priority,
        labels={GANG_LABEL: gang} if gang else {},
    )


def _lease(
    rv: int, server: str, *holders: tuple[str, int], at: float | None = None
) -> LeaseVersion:
    return LeaseVersion(
        rv=rv,
        at=float(rv) if at is None else at,
        server=server,
        holders=tuple(
            (uid, tuple(f"{server}/GPU-{c}" for c in "ab"[:cards])) for uid, cards in holders
        ),
    )


def test_a_namespace_at_its_quota_passes_and_one_card_over_fails() -> None:
    lives = {u: _life(u) for u in "pqr"}
    within = [_lease(2, "gpu-01", ("p", 1)), _lease(3, "gpu-02", ("q", 1))]
    assert check_quotas(Holdings.of(within, lives), SETUP).passed
    over = [*within, _lease(4, "gpu-03", ("r", 1)), _lease(5, "gpu-03")]
    result = check_quotas(Holdings.of(over, lives), SETUP)
    assert not result.passed
    assert "team-a held 3 cards at rv 4, quota 2" in result.detail


def test_holdings_follow_claims_leaving_and_namespaces_without_a_quota_are_free() -> None:
    lives = {"p": _life("p"), "q": _life("q"), "d": _life("d", "default")}
    leases = [
        _lease(2, "gpu-01", ("p", 2)),
        _lease(3, "gpu-01"),
        _lease(4, "gpu-02", ("q", 2), ("d", 0)),
        _lease(5, "gpu-03", ("d", 2)),
    ]
    holdings = Holdings.of(leases, lives)
    assert holdings.before(3) == {"team-a": 2}
    assert holdings.before(4) == {}
    assert holdings.before(6) == {"team-a": 2, "default": 2}
    assert check_quotas(holdings, SETUP).passed


def _run(uid: str, start: float, end: float) -> RunRecord:
    return RunRecord(
        uid=uid,
        key=f"team-a/{uid}",
        node="node-01",
        env={},
        endpoint="e",
        gpus=("GPU-a",),
        annotations={},
        started_at=start,
        finished_at=end,
        phase="Succeeded",
    )


def _gang_lives() -> list[PodLife]:
    return [_life("m1", gang="g"), _life("m2", gang="g")]


def test_a_gang_booked_whole_passes_even_when_its_members_start_apart() -> None:
    claims = ClaimHistory.of(
        [_lease(2, "gpu-01", ("m1", 1)), _lease(3, "gpu-02", ("m2", 1)), _lease(20, "gpu-02")]
    )
    runs = {"m1": _run("m1", 5.0, 6.0), "m2": _run("m2", 8.0, 12.0)}
    assert check_gangs_whole(_gang_lives(), runs, claims, set(), 30.0).passed


def test_a_gang_member_running_while_its_sibling_holds_nothing_fails() -> None:
    # m2 is booked only after m1 has run: admitted in part.
    claims = ClaimHistory.of([_lease(2, "gpu-01", ("m1", 1)), _lease(9, "gpu-02", ("m2", 1))])
    runs = {"m1": _run("m1", 5.0, 6.0), "m2": _run("m2", 10.0, 12.0)}
    result = check_gangs_whole(_gang_lives(), runs, claims, set(), 30.0)
    assert not result.passed
    assert "team-a/m1 ran while team-a/m2 had neither started nor a claim" in result.detail


def test_a_sibling_whose_booking_went_while_the_gang_ran_fails_unless_it_was_evicted() -> None:
    claims = ClaimHistory.of(
        [_lease(2, "gpu-01", ("m1", 1)), _lease(3, "gpu-02", ("m2", 1)), _lease(6, "gpu-02")]
    )
    runs = {"m1": _run("m1", 5.0, 9.0)}
    assert not check_gangs_whole(_gang_lives(), runs, claims, set(), 30.0).passed
    excused = check_gangs_whole(_gang_lives(), runs, claims, {"team-a/m2"}, 30.0)
    assert excused.passed and "1 excused" in excused.name


def _soak_pod(key: str, cards: int = 1) -> SoakPod:
    namespace, name = key.split("/")
    return SoakPod(
        name=name,
        namespace=namespace,
        arrival_seconds=0.0,
        run_seconds=1.0,
        containers=(("main", cards, None),),
        init_cards=0,
        fate="run",
        delete_after_seconds=0.0,
    )


def _fair(lives: dict[str, PodLife], leases: list[LeaseVersion]) -> bool:
    inputs = FairInputs(
        setup=QueueSetup(quotas={}, weights={"team-a": 1, "team-b": 1}),
        plans={life.key: _soak_pod(life.key) for life in lives.values()},
        memory=MEMORY,
        granularity="card",
    )
    claims = ClaimHistory.of(leases)
    result = check_fair_share(lives, leases, claims, Holdings.of(leases, lives), inputs)
    return result.passed


def test_the_namespace_holding_more_admitted_while_one_holding_nothing_waits_fails() -> None:
    # team-b holds two cards; team-a holds none and its q waited from t=0; at t=10 team-b's
    # third pod is admitted on cards that would have taken q, and q waits on till t=30.
    lives = {
        "b1": _life("b1", "team-b"),
        "b2": _life("b2", "team-b"),
        "b3": _life("b3", "team-b", created=5.0),
        "q": _life("q", "team-a", created=0.0),
    }
    leases = [
        _lease(2, "gpu-01", ("b1", 1), ("b2", 1), at=1.0),
        _lease(10, "gpu-02", ("b3", 1), at=10.0),
        _lease(30, "gpu-03", ("q", 1), at=30.0),
    ]
    assert not _fair(lives, leases)


def test_fair_share_passes_when_the_waiter_came_too_late_or_was_booked_in_the_same_pass() -> None:
    base = {"b1": _life("b1", "team-b"), "b2": _life("b2", "team-b")}
    early = [_lease(2, "gpu-01", ("b1", 1), ("b2", 1), at=1.0)]
    lives = {
        **base,
        "b3": _life("b3", "team-b", created=5.0),
        "q": _life("q", "team-a", created=9.5),
    }
    late = [
        *early,
        _lease(10, "gpu-02", ("b3", 1), at=10.0),
        _lease(30, "gpu-03", ("q", 1), at=30.0),
    ]
    assert _fair(lives, late)  # q had waited half a second when b3 was admitted
    lives["q"] = _life("q", "team-a", created=0.0)
    same = [
        *early,
        _lease(10, "gpu-02", ("b3", 1), at=10.0),
        _lease(11, "gpu-03", ("q", 1), at=10.5),
    ]
    assert _fair(lives, same)  # q's booking landed with b3's: one pass admitted both


def test_fair_share_lets_a_namespace_under_its_weight_go_ahead() -> None:
    # team-b holds two cards, team-a one: with team-b weighing 3, team-b is the one under its
    # share; with equal weights team-a (two cards once q is in) would not be above team-b.
    lives = {
        "a1": _life("a1", "team-a"),
        "b1": _life("b1", "team-b"),
        "b2": _life("b2", "team-b", created=5.0),
        "q": _life("q", "team-a", created=0.0),
    }
    leases = [
        _lease(2, "gpu-01", ("a1", 1), at=1.0),
        _lease(3, "gpu-04", ("b1", 2), at=1.0),
        _lease(10, "gpu-02", ("b2", 1), at=10.0),
        _lease(30, "gpu-03", ("q", 1), at=30.0),
    ]
    inputs = FairInputs(
        setup=QueueSetup(quotas={}, weights={"team-a": 1, "team-b": 3}),
        plans={life.key: _soak_pod(life.key) for life in lives.values()},
        memory=MEMORY,
        granularity="card",
    )
    claims = ClaimHistory.of(leases)
    holdings = Holdings.of(leases, lives)
    assert check_fair_share(lives, leases, claims, holdings, inputs).passed
    assert not _fair(lives, leases)


def test_a_waiter_whose_quota_is_full_or_whose_ask_does_not_fit_is_not_passed_over() -> None:
    lives = {
        "b1": _life("b1", "team-b"),
        "b2": _life("b2", "team-b"),
        "b3": _life("b3", "team-b", created=5.0),
        "q": _life("q", "team-a", created=0.0),
    }
    leases = [
        _lease(2, "gpu-01", ("b1", 1), ("b2", 1), at=1.0),
        _lease(10, "gpu-02", ("b3", 1), at=10.0),
        _lease(30, "gpu-03", ("q", 2), at=30.0),
    ]
    plans = {life.key: _soak_pod(life.key) for life in lives.values()}
    plans["team-a/q"] = _soak_pod("team-a/q", cards=2)  # b3's one card would not take q
    inputs = FairInputs(
        setup=QueueSetup(quotas={}, weights={}), plans=plans, memory=MEMORY, granularity="card"
    )
    claims, holdings = ClaimHistory.of(leases), Holdings.of(leases, lives)
    assert check_fair_share(lives, leases, claims, holdings, inputs).passed
    full = FairInputs(
        setup=QueueSetup(quotas={"team-a": 0}, weights={}),
        plans={life.key: _soak_pod(life.key) for life in lives.values()},
        memory=MEMORY,
        granularity="card",
    )
    assert check_fair_share(lives, leases, claims, holdings, full).passed


def test_quotas_cover_the_largest_gang_and_a_unit_over_its_quota_cannot_finish() -> None:
    shape = WorkloadShape(
        pods=300, seed=5, namespaces=("default", "team-a", "team-b"), gang_share=0.2
    )
    pods = plan_soak_workload(shape)
    servers = [[40960] * 4] * 8
    setup = plan_queues(pods, servers, "server")
    assert setup.quotas == {"team-a": 12, "team-b": 16}
    assert queue_problems(pods, setup, servers, "server") == []
    tight = QueueSetup(quotas={"team-a": 4, "team-b": 4}, weights={})
    assert any(
        "needs 12 cards, quota 4" in p for p in queue_problems(pods, tight, servers, "server")
    )
    assert "team-a: {cards: 12, weight: 1}" in setup.document()


def test_a_wake_up_counts_from_when_the_quota_had_room() -> None:
    lives = [_life("p"), _life("x"), _life("y")]
    by_uid = {life.uid: life for life in lives}
    leases = [
        _lease(2, "gpu-01", ("x", 1), ("y", 1), at=1.0),
        _lease(3, "gpu-01", ("x", 1), at=20.0),  # team-a gets room for p at t=20
        _lease(4, "gpu-02", ("p", 1), at=20.5),
    ]
    p = by_uid["p"]
    p.bound_at, p.created_at = 21.0, 0.5
    waits = [WakeUp(key="team-a/p", server="gpu-02", seconds=21.0 - 2.0)]  # gpu-02 freed at t=2
    holdings = Holdings.of(leases, by_uid)
    [found] = queue_waits(waits, lives, holdings, ClaimHistory.of(leases), SETUP)
    assert found.seconds == 1.0


def test_a_gang_member_that_never_ran_beside_siblings_that_did_fails() -> None:
    # m2 held its claim while m1 ran, then lost it and never ran: the gang ran in part.
    claims = ClaimHistory.of(
        [_lease(2, "gpu-01", ("m1", 1)), _lease(3, "gpu-02", ("m2", 1)), _lease(12, "gpu-02")]
    )
    lives = _gang_lives()
    lives[1].end_at = 20.0
    runs = {"m1": _run("m1", 5.0, 6.0)}
    result = check_gangs_whole(lives, runs, claims, set(), 30.0)
    assert not result.passed
    assert "team-a/m1 ran while team-a/m2 never ran" in result.detail
    assert check_gangs_whole(lives, runs, claims, {"team-a/m2"}, 30.0).passed


def test_a_waiter_promised_a_server_elsewhere_is_not_passed_over() -> None:
    # q is a preemption's nominee on gpu-09 (promised until wall 100): it books nothing else.
    lives = {
        "b1": _life("b1", "team-b"),
        "b2": _life("b2", "team-b"),
        "b3": _life("b3", "team-b", created=5.0),
        "q": _life("q", "team-a", created=0.0),
    }
    promise = NominationSeen(uid="q", priority=0, cards=(), victims=(), expires_at=100.0)
    leases = [
        _lease(2, "gpu-01", ("b1", 1), ("b2", 1), at=1.0),
        LeaseVersion(rv=5, at=5.0, server="gpu-09", nomination=promise, wall=5.0),
        LeaseVersion(
            rv=10, at=10.0, wall=10.0, server="gpu-02", holders=(("b3", ("gpu-02/GPU-a",)),)
        ),
        _lease(30, "gpu-03", ("q", 1), at=30.0),
    ]
    assert _fair(lives, leases)


def test_fair_share_allows_for_an_allocator_that_saw_a_release_a_moment_late() -> None:
    # team-a's a1 left at t=9, a second before team-b's b2 was admitted: an allocator whose
    # cache still showed a1 rightly let team-b go first.
    lives = {
        "a1": _life("a1", "team-a"),
        "b1": _life("b1", "team-b"),
        "b2": _life("b2", "team-b", created=5.0),
        "q": _life("q", "team-a", created=0.0),
    }
    leases = [
        _lease(2, "gpu-01", ("a1", 2), at=1.0),
        _lease(3, "gpu-04", ("b1", 2), at=1.0),
        _lease(8, "gpu-01", at=9.0),
        _lease(10, "gpu-02", ("b2", 1), at=10.0),
        _lease(30, "gpu-03", ("q", 1), at=30.0),
    ]
    assert _fair(lives, leases)
    late = [*leases[:2], _lease(8, "gpu-01", at=2.0), *leases[3:]]
    assert not _fair(lives, late)  # a1 had left eight seconds before: no excuse


def test_fair_share_counts_the_waiters_namespace_with_its_bookings_in_flight() -> None:
    # team-a's a2 booking was in flight when b2 was admitted (it landed a second later): the
    # allocator counted it, and team-a was no longer under team-b then.
    lives = {
        "a1": _life("a1", "team-a"),
        "a2": _life("a2", "team-a"),
        "b1": _life("b1", "team-b"),
        "b2": _life("b2", "team-b", created=5.0),
        "q": _life("q", "team-a", created=0.0),
    }
    early = [_lease(2, "gpu-01", ("a1", 1), at=1.0), _lease(3, "gpu-04", ("b1", 2), at=1.0)]
    admitted = [_lease(10, "gpu-02", ("b2", 1), at=10.0), _lease(30, "gpu-03", ("q", 1), at=30.0)]
    in_flight = [*early, *admitted[:1], _lease(11, "gpu-05", ("a2", 1), at=11.0), admitted[1]]
    assert _fair(lives, in_flight)
    landed_late = [*early, *admitted[:1], _lease(20, "gpu-05", ("a2", 1), at=20.0), admitted[1]]
    assert not _fair(lives, landed_late)
