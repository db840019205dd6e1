"""The soak's verdict on recorded evidence: each check passes on a clean record and fails on
the failure it exists to catch."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from rich.console import Console

from rgpu_kubesim.kubelet import RunRecord
from rgpu_sim.checks import check_no_sharing
from rgpu_sim.soak_evidence import Evidence, LeaseVersion, NominationSeen, PodLife
from rgpu_sim.soak_faults import FaultWindow
from rgpu_sim.soak_report import SoakReport, print_soak_report
from rgpu_sim.verdict import (
    WakeUp,
    check_commits_held,
    check_completion,
    check_no_5xx,
    check_no_leftover_claims,
    check_restarts,
    check_wakeups,
    wake_seconds,
)

CARD_A = "gpu-01/GPU-a"
CARD_B = "gpu-01/GPU-b"


def _lease(rv: int, *holders: tuple[str, tuple[str, ...]], at: float | None = None) -> LeaseVersion:
    return LeaseVersion(rv=rv, at=float(rv) if at is None else at, server="gpu-01", holders=holders)


def _pod(uid: str, bound: int, end: int | None, cards: tuple[str, ...] = (CARD_A,)) -> PodLife:
    return PodLife(
        uid=uid,
        key=f"default/{uid}",
        cards=cards,
        bound_rv=bound,
        bound_at=float(bound),
        end_rv=end,
        end_at=None if end is None else float(end),
        phase="Succeeded",
    )


def _run(uid: str, endpoint: str, start: float, end: float) -> RunRecord:
    return RunRecord(
        uid=uid,
        key=f"default/{uid}",
        node="node-01",
        env={},
        endpoint=endpoint,
        gpus=("GPU-a",),
        annotations={},
        started_at=start,
        finished_at=end,
        phase="Succeeded",
    )


def test_a_claim_held_from_commit_to_the_pods_end_passes() -> None:
    leases = [_lease(1, ("p", (CARD_A,))), _lease(5, ("p", (CARD_A,)), ("q", (CARD_B,))), _lease(9)]
    assert check_commits_held(leases, [_pod("p", bound=2, end=8)]).passed


def test_a_commit_lost_while_its_pod_runs_fails() -> None:
    # The race of issue 14: committed, bound, then dropped by a removal judged on an older read.
    leases = [_lease(1, ("p", (CARD_A,))), _lease(4), _lease(6, ("q", (CARD_A,)))]
    result = check_commits_held(leases, [_pod("p", bound=2, end=8)])
    assert not result.passed
    assert "claim gone at rv 4" in result.detail


def test_a_pod_bound_without_its_claim_in_the_lease_fails() -> None:
    result = check_commits_held([_lease(1), _lease(9)], [_pod("p", bound=2, end=8)])
    assert not result.passed
    assert "not in the Lease" in result.detail


def test_a_pod_still_running_at_the_end_must_still_hold_its_claim() -> None:
    leases = [_lease(1, ("p", (CARD_A,))), _lease(7)]
    assert not check_commits_held(leases, [_pod("p", bound=2, end=None)]).passed


def test_a_double_booking_by_time_intervals_fails() -> None:
    runs = [_run("p", "127.1.0.1:14833", 0.0, 5.0), _run("q", "127.1.0.1:14833", 4.0, 6.0)]
    result = check_no_sharing(runs, now=10.0, per_card=False)
    assert not result.passed
    assert "default/p and default/q" in result.detail


def test_a_claim_left_after_every_pod_is_gone_fails() -> None:
    result = check_no_leftover_claims({"gpu-01": frozenset({"p"}), "gpu-02": frozenset()}, 4.0)
    assert not result.passed
    assert result.detail == "gpu-01: p"
    assert check_no_leftover_claims({"gpu-01": frozenset()}, 4.0).passed


def test_a_pod_that_never_ran_fails_unless_the_workload_deleted_it() -> None:
    outcomes = {"default/a": ("Succeeded", "e:1", 1.0)}
    planned = ["default/a", "default/b"]
    assert not check_completion(planned, set(), outcomes, [], {}).passed
    assert check_completion(planned, {"default/b"}, outcomes, [], {}).passed


def test_a_failed_start_is_excused_only_inside_an_injected_down_window() -> None:
    outcomes = {"default/a": ("Failed", "e:1", 5.0)}
    down = [FaultWindow(kind="lupine-down", target="gpu-01", start=4.0, end=6.0)]
    servers = {"e:1": "gpu-01"}
    assert check_completion(["default/a"], set(), outcomes, down, servers).passed
    late = [FaultWindow(kind="lupine-down", target="gpu-01", start=6.0, end=8.0)]
    assert not check_completion(["default/a"], set(), outcomes, late, servers).passed


def test_a_failed_start_is_excused_when_a_down_window_began_while_it_was_dialling() -> None:
    # One fault on the server ended and the next began between the pod's start and its dial.
    outcomes = {"default/a": ("Failed", "e:1", 5.0)}
    servers = {"e:1": "gpu-01"}
    gap = [
        FaultWindow(kind="lupine-down", target="gpu-01", start=1.0, end=4.99),
        FaultWindow(kind="server-lost", target="gpu-01", start=5.02, end=20.0),
    ]
    assert check_completion(["default/a"], set(), outcomes, gap, servers).passed
    later = [FaultWindow(kind="server-lost", target="gpu-01", start=6.0, end=20.0)]
    assert not check_completion(["default/a"], set(), outcomes, later, servers).passed


def test_a_failed_pod_is_named_with_the_kubelets_word_on_why() -> None:
    outcomes = {"default/a": ("Failed", "e:1", 5.0), "default/b": ("Failed", "e:1", 6.0)}
    why = {"default/a": "cannot connect to lupine at e:1 from 127.1.0.9: nothing answers"}
    found = check_completion(["default/a", "default/b"], set(), outcomes, [], {}, why)
    assert not found.passed
    assert found.detail == (
        "default/a Failed (cannot connect to lupine at e:1 from 127.1.0.9: nothing answers); "
        "default/b Failed"
    )


def test_any_observed_5xx_fails() -> None:
    assert check_no_5xx([]).passed
    assert not check_no_5xx(["default/a: failed filter with extender, code 500"]).passed


def test_wake_up_is_measured_from_the_last_other_claim_leaving() -> None:
    leases = [
        _lease(1, ("old", (CARD_A,)), at=1.0),
        _lease(3, at=10.0),
        _lease(4, ("p", (CARD_A,)), at=10.5),
    ]
    lives = [_pod("old", bound=1, end=2), _pod("p", bound=5, end=9)]
    lives[0].end_at, lives[1].bound_at = 9.8, 11.0
    assert [w.seconds for w in wake_seconds(leases, lives, {"p": 0.5}, [], per_card=False)] == [1.0]


def test_a_server_under_an_injected_fault_is_left_out_of_the_wake_ups() -> None:
    leases = [_lease(1, ("old", (CARD_A,)), at=1.0), _lease(3, at=10.0)]
    lives = [_pod("old", bound=1, end=2), _pod("p", bound=5, end=9)]
    lives[1].bound_at = 15.0
    down = [FaultWindow(kind="node-not-ready", target="gpu-01", start=9.0, end=14.0)]
    assert wake_seconds(leases, lives, {"p": 0.5}, down, per_card=False) == []
    assert [w.seconds for w in wake_seconds(leases, lives, {"p": 0.5}, [], per_card=False)] == [5.0]


def _wake(seconds: float, key: str = "default/p") -> WakeUp:
    return WakeUp(key=key, server="gpu-01", seconds=seconds)


def test_slow_wake_ups_fail_at_the_99th_percentile() -> None:
    assert check_wakeups([_wake(0.3)] * 99).passed
    assert not check_wakeups([_wake(0.3)] * 90 + [_wake(5.0)] * 10).passed


def test_no_wake_ups_are_said_as_such_not_as_nan_figures() -> None:
    result = check_wakeups([], what="gated pods admitted and bound")
    assert result.passed
    assert "none to judge, no pod waited for capacity to free" in result.name
    assert "nan" not in result.name


def test_the_summary_gives_wake_up_figures_only_where_pods_waited(capsys) -> None:
    report = SoakReport(
        pods=1,
        wall_seconds=1.0,
        bound=1,
        succeeded=1,
        deleted=0,
        waits=(),
        faults={},
        checks=(),
        woken="gated pods admitted and bound",
    )
    print_soak_report(report, Console(width=200))
    printed = capsys.readouterr().out
    assert "none: no pod waited for capacity to free (0 gated pods admitted and bound)" in printed
    print_soak_report(replace(report, waits=(0.25, 0.5)), Console(width=200))
    assert "p50 0.38s, p99 0.50s (2 gated pods admitted and bound)" in capsys.readouterr().out


def test_a_failed_wake_up_check_names_the_slowest_and_the_nominee_holding_the_server() -> None:
    late = WakeUp(key="default/slow", server="gpu-07", seconds=9.0, promised_to="default/vip")
    result = check_wakeups([_wake(0.3)] * 90 + [_wake(5.0)] * 9 + [late])
    assert not result.passed
    assert "default/slow on gpu-07 9.00s, nominated for default/vip" in result.detail


def test_a_wake_up_names_the_nominee_the_freeing_lease_version_carried() -> None:
    nomination = NominationSeen(uid="vip", priority=1000, cards=(), victims=(), expires_at=0.0)
    freed = replace(_lease(3, at=10.0), nomination=nomination)
    leases = [_lease(1, ("old", (CARD_A,)), at=1.0), freed, _lease(4, ("p", (CARD_A,)), at=10.5)]
    lives = [_pod("old", bound=1, end=2), _pod("p", bound=5, end=9), _pod("vip", bound=6, end=9)]
    lives[0].end_at, lives[1].bound_at = 9.8, 11.0
    (wake,) = wake_seconds(leases, lives, {"p": 0.5}, [], per_card=False)
    assert wake.promised_to == lives[2].key


def test_a_replica_that_died_unplanned_or_stayed_down_fails() -> None:
    kills = Counter({"allocator-1": 2})
    starts = {"allocator-1": 3, "allocator-2": 1}
    assert check_restarts(kills, starts, {"allocator-1", "allocator-2"}).passed
    assert not check_restarts(kills, {**starts, "allocator-2": 2}, {"allocator-1"}).passed


def test_evidence_follows_binding_and_end_by_resource_version() -> None:
    evidence = Evidence()
    pod = {"metadata": {"uid": "u", "namespace": "default", "name": "p", "resourceVersion": "7"}}
    evidence.on_pod("ADDED", pod)
    bound = {
        "metadata": {
            **pod["metadata"],
            "resourceVersion": "9",
            "annotations": {"hami.io/remote-gpu-devices-allocated": f"{CARD_A},RemoteGPU,0,100:;"},
        },
        "spec": {"nodeName": "node-01"},
        "status": {"phase": "Pending"},
    }
    evidence.on_pod("MODIFIED", bound)
    evidence.on_pod(
        "DELETED", {**bound, "metadata": {**bound["metadata"], "resourceVersion": "12"}}
    )
    life = evidence.pods["u"]
    assert (life.bound_rv, life.end_rv, life.server, life.deleted) == (9, 12, "gpu-01", True)
