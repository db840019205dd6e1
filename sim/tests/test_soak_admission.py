"""The gate path's verdict on recorded evidence: each check passes on a clean record and fails
on the failure it exists to catch — a pod filtered before it was admitted, a gate lifted with
no booking, a pod that took several scheduling cycles, a gated pod nudged."""

from __future__ import annotations

from rgpu_kubesim import PodRecord
from rgpu_sim.soak_admission import (
    ClaimHistory,
    check_admitted_before_filter,
    check_cycles,
    check_no_gated_nudge,
    count_cycles,
    gated_parked,
)
from rgpu_sim.soak_evidence import Evidence, LeaseVersion, PodLife

CARD = "gpu-01/GPU-a"


def _lease(rv: int, *uids: str) -> LeaseVersion:
    return LeaseVersion(
        rv=rv, at=float(rv), server="gpu-01", holders=tuple((u, (CARD,)) for u in uids)
    )


def _life(
    uid: str, *, lifted: int | None = 3, bound: int | None = 5, gated: bool = True
) -> PodLife:
    return PodLife(
        uid=uid,
        key=f"default/{uid}",
        cards=(CARD,),
        gated=gated,
        lifted_rv=lifted,
        lifted_at=None if lifted is None else float(lifted),
        bound_rv=bound,
        bound_at=None if bound is None else float(bound),
        created_rv=1,
        created_at=1.0,
    )


def _record(uid: str, attempts: int = 1, errors: tuple[str, ...] = ()) -> PodRecord:
    return PodRecord(
        uid=uid, key=f"default/{uid}", first_seen=1.0, attempts=attempts, errors=errors
    )


def test_a_pod_booked_then_lifted_then_filtered_passes() -> None:
    claims = ClaimHistory.of([_lease(2, "p"), _lease(9)])
    result = check_admitted_before_filter([_life("p")], {"p": 4}, claims)
    assert result.passed, result.detail
    assert "1 pods filtered" in result.name


def test_a_gate_lifted_with_no_claim_booked_fails() -> None:
    # The claim is written only after the gate went: the pod reached the scheduler unbooked.
    claims = ClaimHistory.of([_lease(4, "p"), _lease(9)])
    result = check_admitted_before_filter([_life("p")], {"p": 5}, claims)
    assert not result.passed
    assert "gate lifted at rv 3 with no claim booked" in result.detail


def test_a_pod_filtered_while_still_gated_fails() -> None:
    claims = ClaimHistory.of([_lease(2, "p")])
    result = check_admitted_before_filter([_life("p", lifted=6)], {"p": 4}, claims)
    assert not result.passed
    assert "reached /filter at rv 4 while still gated" in result.detail


def test_a_gpu_pod_that_never_carried_the_gate_fails() -> None:
    claims = ClaimHistory.of([_lease(2, "p")])
    result = check_admitted_before_filter([_life("p", gated=False)], {"p": 4}, claims)
    assert not result.passed
    assert "without rgpu's gate" in result.detail


def test_one_cycle_per_admitted_pod_passes_and_lapsed_or_erred_pods_are_left_out() -> None:
    claims = ClaimHistory.of([_lease(2, "p", "q", "r"), _lease(4, "p", "r"), _lease(9)])
    lives = [_life("p"), _life("q"), _life("r")]
    # q's booking lapsed before its binding (rv 4 dropped it); r's scheduling hit a fault.
    records = {"p": _record("p"), "q": _record("q", 4), "r": _record("r", 3, ("bind 500",))}
    found = count_cycles(lives, records, claims, gate=True)
    assert (found.pods, found.cycles, found.lapsed, found.erred) == (1, 1, 1, 1)
    assert check_cycles(found).passed


def test_admitted_pods_refused_by_the_scheduler_fail_the_cycles_check() -> None:
    claims = ClaimHistory.of([_lease(2, *"abcd"), _lease(9)])
    lives = [_life(u) for u in "abcd"]
    records = {u: _record(u) for u in "abc"} | {"d": _record("d", 3)}
    found = count_cycles(lives, records, claims, gate=True)
    result = check_cycles(found)
    assert not result.passed
    assert found.per_pod == 1.5
    assert "default/d 3" in result.detail


def test_the_filter_path_counts_every_bound_pod_without_gates() -> None:
    lives = [_life("p", gated=False, lifted=None)]
    found = count_cycles(lives, {"p": _record("p", 2)}, ClaimHistory(), gate=False)
    assert (found.pods, found.cycles) == (1, 2)


def _pod(rv: int, *, gates: bool, retry: str = "") -> dict[str, object]:
    annotations = {"rgpu.io/retry-at": retry} if retry else {}
    spec = {"schedulingGates": [{"name": "rgpu.io/admission"}]} if gates else {}
    return {
        "metadata": {
            "uid": "p",
            "namespace": "default",
            "name": "p",
            "resourceVersion": str(rv),
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def test_the_evidence_follows_the_gate_and_a_nudge_while_it_was_on_fails() -> None:
    evidence = Evidence()
    evidence.on_pod("ADDED", _pod(1, gates=True))
    evidence.on_pod("MODIFIED", _pod(2, gates=True, retry="1700000000"))
    evidence.on_pod("MODIFIED", _pod(3, gates=False, retry="1700000000"))
    evidence.on_pod("MODIFIED", _pod(4, gates=False, retry="1700000009"))
    life = evidence.pods["p"]
    assert (life.gated, life.lifted_rv, life.nudges) == (True, 3, [2])
    result = check_no_gated_nudge(evidence.pods.values())
    assert not result.passed
    assert "default/p nudged at rv 2" in result.detail


def test_a_nudge_after_the_gate_went_is_the_filter_paths_own_and_passes() -> None:
    evidence = Evidence()
    evidence.on_pod("ADDED", _pod(1, gates=True))
    evidence.on_pod("MODIFIED", _pod(3, gates=False))
    evidence.on_pod("MODIFIED", _pod(4, gates=False, retry="1700000009"))
    result = check_no_gated_nudge(evidence.pods.values())
    assert result.passed, result.detail
    assert "1 pods waited behind rgpu's gate, 0 nudged" in result.name


def test_the_gate_path_judges_the_wake_up_of_every_gated_pod_but_the_erred() -> None:
    lives = [_life("p"), _life("q"), _life("r", gated=False)]
    assert gated_parked(lives, frozenset({"q"})) == {"p": 1.0}


def test_a_claim_history_knows_which_claim_stood_at_an_rv() -> None:
    claims = ClaimHistory.of([_lease(2, "p"), _lease(5), _lease(7, "p")])
    assert claims.held("p", 3) is not None and claims.held("p", 6) is None
    assert claims.kept("p", 3, 5) and not claims.kept("p", 3, 6)
    assert [s.start_rv for s in claims.spans["p"]] == [2, 7]
