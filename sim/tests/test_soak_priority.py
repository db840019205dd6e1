"""The priority mix's verdict on recorded evidence: each check passes on a clean record and
fails on the failure it exists to catch."""

from __future__ import annotations

import json

from rgpu_sim.soak_evidence import Evidence, LeaseVersion, NominationSeen, PodLife
from rgpu_sim.soak_faults import FaultWindow
from rgpu_sim.soak_priority import (
    check_budgets,
    check_no_inversion,
    check_no_wasted_evictions,
    check_preemption_latency,
    evictions,
    preemption_summary,
    preemption_waits,
)
from rgpu_sim.soak_workload import BUDGET_LABEL, BUDGETS, WorkloadShape, plan_soak_workload

CARD_A = "gpu-01/GPU-a"
CARD_B = "gpu-01/GPU-b"
BATCH, URGENT = 10, 1000


def _life(
    uid: str,
    *,
    priority: int = BATCH,
    created: int = 1,
    bound: int | None = None,
    server: str = "gpu-01",
    deleting: int | None = None,
    end: int | None = None,
    budget: str | None = None,
    healthy_from: int | None = None,
    grace: float = 2.0,
) -> PodLife:
    life = PodLife(
        uid=uid,
        key=f"default/{uid}",
        cards=(f"{server}/GPU-a",) if bound is not None else (),
        bound_rv=bound,
        bound_at=None if bound is None else float(bound),
        end_rv=end,
        end_at=None if end is None else float(end),
        priority=priority,
        labels={BUDGET_LABEL: budget} if budget else {},
        created_rv=created,
        created_at=float(created),
        grace_seconds=grace,
        deleting_rv=deleting,
        deleting_at=None if deleting is None else float(deleting),
    )
    if healthy_from is not None:
        life.healthy = [(created, False), (healthy_from, True)]
        if deleting is not None:
            life.healthy.append((deleting, False))
    return life


def _nomination(
    uid: str, *victims: str, expires: float = 100.0, cards: tuple[str, ...] = (CARD_A,)
) -> NominationSeen:
    return NominationSeen(
        uid=uid, priority=URGENT, cards=cards, victims=victims, expires_at=expires
    )


def _lease(
    rv: int,
    *holders: tuple[str, tuple[str, ...]],
    nomination: NominationSeen | None = None,
    server: str = "gpu-01",
) -> LeaseVersion:
    return LeaseVersion(
        rv=rv, at=float(rv), wall=float(rv), server=server, holders=holders, nomination=nomination
    )


def test_a_deletion_the_workload_did_not_ask_for_is_an_eviction_for_the_last_nominee() -> None:
    leases = [_lease(3, ("v", (CARD_A,)), nomination=_nomination("u", "v"))]
    victim, deleted = _life("v", deleting=5), _life("w", deleting=6)
    found = evictions(leases, [victim, deleted], {"default/w": 5.5})
    assert [(e.victim.uid, e.server, e.preemptor, e.nominated_rv) for e in found] == [
        ("v", "gpu-01", "u", 3)
    ]


def test_an_eviction_whose_preemptor_booked_the_server_passes_even_if_its_binding_failed() -> None:
    leases = [
        _lease(3, ("v", (CARD_A,)), nomination=_nomination("u", "v")),
        _lease(8, ("u", (CARD_A,))),
    ]
    pods = {"v": _life("v", deleting=5), "u": _life("u", priority=URGENT, bound=9)}
    found = evictions(leases, pods.values(), {})
    assert check_no_wasted_evictions(found, leases, pods, {}).passed
    # The Binding failed (an injected fault) and the pod ended up elsewhere: it still got it.
    pods["u"] = _life("u", priority=URGENT, bound=12, server="gpu-02")
    assert check_no_wasted_evictions(found, leases, pods, {}).passed


def test_an_eviction_whose_preemptor_booked_another_server_fails() -> None:
    # Seen in the soak (seed 1): the server freed, the nominee took another that freed too.
    leases = [
        _lease(3, ("v", (CARD_A,)), nomination=_nomination("u", "v")),
        _lease(6, nomination=_nomination("u", "v")),
        _lease(7, ("u", ("gpu-02/GPU-a",)), server="gpu-02"),
    ]
    pods = {"v": _life("v", deleting=5), "u": _life("u", priority=URGENT, bound=9, server="gpu-02")}
    result = check_no_wasted_evictions(evictions(leases, pods.values(), {}), leases, pods, {})
    assert not result.passed
    assert (
        "default/v evicted from gpu-01 at rv 5 for default/u, which never booked it"
        in result.detail
    )


def test_an_eviction_whose_freed_server_a_fault_took_out_before_the_preemptor_ran_is_excused():
    # Seen in the soak (server, seed 77): gpu-01's Node went NotReady a moment after the
    # eviction; the nominee could not take it and was freed to preempt another.
    leases = [
        _lease(3, ("v", (CARD_A,)), nomination=_nomination("u", "v")),
        _lease(7, ("u", ("gpu-02/GPU-a",)), server="gpu-02"),
    ]
    pods = {"v": _life("v", deleting=5), "u": _life("u", priority=URGENT, bound=9, server="gpu-02")}
    found = evictions(leases, pods.values(), {})
    during = [FaultWindow(kind="node-not-ready", target="gpu-01", start=6.0, end=12.0)]
    result = check_no_wasted_evictions(found, leases, pods, {}, during)
    assert result.passed
    assert "1 freed servers a fault took out" in result.name
    after = [FaultWindow(kind="node-not-ready", target="gpu-01", start=10.0, end=12.0)]
    elsewhere = [FaultWindow(kind="node-not-ready", target="gpu-03", start=6.0, end=12.0)]
    for windows in (after, elsewhere):
        assert not check_no_wasted_evictions(found, leases, pods, {}, windows).passed


def test_a_victim_evicted_before_a_budget_refused_the_next_one_fails() -> None:
    # Seen in the soak (card, seed 2, 3 servers): v went, w's budget said no, the nomination
    # was taken back, and u was bound elsewhere: v was evicted for nothing.
    nominated = _nomination("u", "v", "w")
    leases = [
        _lease(3, ("v", (CARD_A,)), ("w", (CARD_B,)), nomination=nominated),
        _lease(6, ("v", (CARD_A,)), ("w", (CARD_B,))),
        _lease(7, ("u", ("gpu-02/GPU-a",)), server="gpu-02"),
    ]
    pods = {
        "v": _life("v", deleting=5),
        "w": _life("w", budget="guarded"),
        "u": _life("u", priority=URGENT, bound=9, server="gpu-02"),
    }
    found = evictions(leases, pods.values(), {})
    assert [e.victim.uid for e in found] == ["v"]
    assert not check_no_wasted_evictions(found, leases, pods, {}).passed


def test_an_eviction_is_excused_only_when_the_workload_deleted_the_unbound_preemptor() -> None:
    leases = [_lease(3, ("v", (CARD_A,)), nomination=_nomination("u", "v"))]
    pods = {"v": _life("v", deleting=5), "u": _life("u", priority=URGENT, deleting=7, end=7)}
    found = evictions(leases, pods.values(), {"default/u": 6.0})
    assert check_no_wasted_evictions(found, leases, pods, {"default/u": 6.0}).passed
    assert not check_no_wasted_evictions(found, leases, pods, {}).passed


def test_an_eviction_no_nomination_named_fails() -> None:
    pods = {"v": _life("v", deleting=5)}
    result = check_no_wasted_evictions(evictions([], pods.values(), {}), [], pods, {})
    assert not result.passed
    assert "no nomination naming it" in result.detail


def test_an_eviction_below_the_budgets_min_available_fails() -> None:
    victim = _life("v", deleting=10, budget="spread", healthy_from=2)
    other = _life("o", deleting=None, budget="spread", healthy_from=3)
    found = evictions([], [victim, other], {})
    assert check_budgets(found, [victim, other], {"spread": 1}).passed
    result = check_budgets(found, [victim, other], {"spread": 2})
    assert not result.passed
    assert "1 healthy spread pods left, minAvailable 2" in result.detail


def test_a_percentage_budget_forbids_evicting_any_healthy_pod_but_not_an_unhealthy_one() -> None:
    victim = _life("v", deleting=10, budget="guarded", healthy_from=2)
    other = _life("o", budget="guarded", healthy_from=3)
    assert not check_budgets(evictions([], [victim, other], {}), [victim, other], BUDGETS).passed
    starting = _life("s", deleting=10, budget="guarded")
    assert check_budgets(evictions([], [starting, other], {}), [starting, other], BUDGETS).passed


def test_a_lower_priority_booking_over_a_live_nomination_fails() -> None:
    leases = [
        _lease(3, ("v", (CARD_A,)), nomination=_nomination("u", "v")),
        _lease(5, nomination=_nomination("u", "v")),
        _lease(6, ("b", (CARD_A,)), nomination=_nomination("u", "v")),
    ]
    pods = [_life("u", priority=URGENT), _life("b", bound=7), _life("v", end=5)]
    result = check_no_inversion(leases, pods, per_card=False)
    assert not result.passed
    assert "default/b (priority 10) booked gpu-01 at rv 6" in result.detail


def test_booking_after_the_nomination_ended_passes() -> None:
    ended = _nomination("u", "v", expires=5.5)
    leases = [
        _lease(3, ("v", (CARD_A,)), nomination=ended),
        _lease(6, ("b", (CARD_A,)), nomination=ended),
    ]
    pods = [_life("u", priority=URGENT), _life("b", bound=7)]
    assert check_no_inversion(leases, pods, per_card=False).passed
    live = [_lease(3, nomination=_nomination("u")), _lease(6, ("b", (CARD_A,)))]
    assert not check_no_inversion(live, pods, per_card=False).passed
    gone = [_life("u", priority=URGENT, deleting=4, end=4), _life("b", bound=7)]
    assert check_no_inversion(live, gone, per_card=False).passed


def test_in_card_granularity_only_the_nominated_cards_are_kept() -> None:
    nominated = _nomination("u", "v", cards=(CARD_A,))
    other_card = [
        _lease(3, nomination=nominated),
        _lease(6, ("b", (CARD_B,)), nomination=nominated),
    ]
    pods = [_life("u", priority=URGENT), _life("b", bound=7)]
    assert check_no_inversion(other_card, pods, per_card=True).passed
    assert not check_no_inversion(other_card, pods, per_card=False).passed


def test_a_higher_priority_booking_over_a_nomination_passes() -> None:
    leases = [
        _lease(3, nomination=_nomination("u")),
        _lease(6, ("x", (CARD_A,)), nomination=_nomination("u")),
    ]
    pods = [_life("u", priority=URGENT), _life("x", priority=URGENT + 1, bound=7)]
    assert check_no_inversion(leases, pods, per_card=False).passed


def test_an_urgent_pod_bound_late_or_never_beside_lower_priority_holders_fails() -> None:
    leases = [_lease(1, ("b", (CARD_A,))), _lease(20, ("u", (CARD_A,)))]
    quick = [_life("b", bound=1), _life("u", priority=URGENT, created=2, bound=6)]
    waits = preemption_waits(leases, quick, {}, [])
    assert [(w.key, w.seconds, w.limit) for w in waits] == [("default/u", 4.0, 7.0)]
    assert check_preemption_latency(waits).passed
    late = [_life("b", bound=1), _life("u", priority=URGENT, created=2, bound=30)]
    assert not check_preemption_latency(preemption_waits(leases, late, {}, [])).passed
    never = [_life("b", bound=1), _life("u", priority=URGENT, created=2)]
    result = check_preemption_latency(preemption_waits(leases, never, {}, []))
    assert not result.passed
    assert "default/u never bound" in result.detail


def test_no_preemptible_server_means_no_wait_is_judged() -> None:
    leases = [_lease(1, ("x", (CARD_A,)))]
    same = [_life("x", priority=URGENT, bound=1), _life("u", priority=URGENT, created=2, bound=40)]
    assert preemption_waits(leases, same, {}, []) == []
    down = [FaultWindow(kind="lupine-down", target="gpu-01", start=0.0, end=50.0)]
    lower = [_life("x", bound=1), _life("u", priority=URGENT, created=2, bound=40)]
    assert preemption_waits(leases, lower, {}, down) == []
    assert preemption_waits(leases, lower, {"default/u": 3.0}, [])[0].seconds == 38.0
    assert preemption_waits(leases, lower, {}, [], frozenset({"u"})) == []


def test_the_summary_counts_nominations_evictions_and_latency() -> None:
    leases = [
        _lease(3, ("v", (CARD_A,)), nomination=_nomination("u", "v")),
        _lease(8, ("u", (CARD_A,))),
    ]
    pods = {"v": _life("v", deleting=5), "u": _life("u", priority=URGENT, bound=9)}
    found = evictions(leases, pods.values(), {})
    summary = preemption_summary(found, [], leases, pods)
    assert summary.startswith(
        "1 nominations (1 booked by their nominee, 0 evicted nobody), 1 evictions"
    )


def test_evidence_reads_the_nomination_priority_deletion_and_health() -> None:
    evidence = Evidence()
    nomination = {
        "pod": {"uid": "u", "namespace": "default", "name": "u"},
        "priority": URGENT,
        "cards": [CARD_A],
        "victims": [{"uid": "v", "namespace": "default", "name": "v"}],
        "nominatedAt": 1.0,
        "expiresAt": 12.5,
    }
    annotations = {"rgpu.io/server": "gpu-01", "rgpu.io/nomination": json.dumps(nomination)}
    evidence.on_lease(
        "MODIFIED", {"metadata": {"resourceVersion": "4", "annotations": annotations}}
    )
    assert evidence.leases[0].nomination == _nomination("u", "v", expires=12.5)
    meta = {"uid": "v", "namespace": "default", "name": "v", "resourceVersion": "5"}
    running = {
        "metadata": meta,
        "spec": {"priority": BATCH, "terminationGracePeriodSeconds": 5},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    evidence.on_pod("ADDED", running)
    deleting = {
        **meta,
        "resourceVersion": "8",
        "deletionTimestamp": "x",
        "deletionGracePeriodSeconds": 2,
    }
    evidence.on_pod("MODIFIED", {**running, "metadata": deleting})
    life = evidence.pods["v"]
    assert (life.priority, life.deleting_rv, life.grace_seconds) == (BATCH, 8, 2.0)
    assert life.healthy_at(6) and not life.healthy_at(9)


def test_the_mix_makes_urgent_and_batch_pods_under_both_budgets_and_keeps_the_shapes() -> None:
    plain = plan_soak_workload(WorkloadShape(pods=300, seed=5))
    mixed = plan_soak_workload(WorkloadShape(pods=300, seed=5, priority_share=0.1))
    assert {p.priority_class for p in plain} == {None}
    assert {p.priority_class for p in mixed} == {"urgent", "batch"}
    assert {p.budget for p in mixed} == {None, *BUDGETS}
    assert [(p.name, p.containers, p.fate) for p in plain] == [
        (p.name, p.containers, p.fate) for p in mixed
    ]
    urgent = next(p for p in mixed if p.priority_class == "urgent").manifest()
    assert urgent["spec"]["priorityClassName"] == "urgent"
    batch = next(p for p in mixed if p.budget == "spread").manifest()
    assert batch["metadata"]["labels"][BUDGET_LABEL] == "spread"
    assert batch["spec"]["terminationGracePeriodSeconds"] in (1, 2, 5)
