from __future__ import annotations

from rgpu_kubesim.kubelet import RunRecord
from rgpu_sim.checks import check_endpoints, check_no_sharing


def _run(
    key: str,
    endpoint: str,
    start: float,
    end: float | None,
    gpus: tuple[str, ...] = ("GPU-1",),
    allocated: str = "",
) -> RunRecord:
    return RunRecord(
        uid=key,
        key=key,
        node="n",
        env={},
        endpoint=endpoint,
        gpus=gpus,
        annotations={"hami.io/remote-gpu-devices-allocated": allocated} if allocated else {},
        started_at=start,
        finished_at=end,
        phase="Succeeded" if end else "Running",
    )


def test_back_to_back_runs_on_one_server_do_not_count_as_sharing() -> None:
    result = check_no_sharing(
        [_run("a", "s:1", 0, 5), _run("b", "s:1", 5, 9)], now=10, per_card=False
    )
    assert result.passed


def test_overlap_is_found_even_when_a_short_run_sits_between() -> None:
    runs = [_run("long", "s:1", 0, 10), _run("short", "s:1", 1, 2), _run("late", "s:1", 3, 4)]
    result = check_no_sharing(runs, now=20, per_card=False)
    assert not result.passed
    assert "long and late" in result.detail


def test_card_granularity_allows_disjoint_cards_on_one_server() -> None:
    runs = [_run("a", "s:1", 0, 5, gpus=("GPU-1",)), _run("b", "s:1", 1, 4, gpus=("GPU-2",))]
    assert check_no_sharing(runs, now=6, per_card=True).passed
    assert not check_no_sharing(runs, now=6, per_card=False).passed


def test_a_still_running_pod_counts_until_now() -> None:
    runs = [_run("a", "s:1", 0, None), _run("b", "s:1", 3, 4)]
    assert not check_no_sharing(runs, now=5, per_card=False).passed


def test_endpoint_must_match_the_claimed_servers_endpoint() -> None:
    allocated = "gpu-a/GPU-1,RemoteGPU,1,100:;"
    good = _run("good", "10.0.0.1:14833", 0, 1, allocated=allocated)
    bad = _run("bad", "10.0.0.2:14833", 0, 1, allocated=allocated)
    endpoints = {"gpu-a": "10.0.0.1:14833"}
    assert check_endpoints([good], endpoints).passed
    result = check_endpoints([good, bad], endpoints)
    assert not result.passed
    assert "bad" in result.detail


def test_a_pod_that_ran_without_a_claim_annotation_fails_the_endpoint_check() -> None:
    assert not check_endpoints(
        [_run("x", "10.0.0.1:14833", 0, 1)], {"gpu-a": "10.0.0.1:14833"}
    ).passed
