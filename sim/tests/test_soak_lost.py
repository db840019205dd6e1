"""The soak's "server lost under its holder" check on recorded evidence: it passes when every
holder was told (and, with ``evict``, ran again elsewhere), and fails on each way that can go
wrong; the fault picks only held servers; the Events are recorded from the apiserver."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rgpu_sim.soak_evidence import Evidence, PodLife
from rgpu_sim.soak_faults import FaultWindow
from rgpu_sim.soak_lost import lost_at, replacements
from rgpu_sim.verdict import LostRule, check_lost_holders

LOST = FaultWindow(kind="server-lost", target="gpu-01", start=100.0, end=110.0)
KEEP = LostRule(grace=2.0, deadline=8.0)
EVICT = LostRule(grace=2.0, deadline=8.0, evict=True)


def holder(
    uid: str,
    *,
    server: str = "gpu-01",
    bound: float = 50.0,
    end: float | None = None,
    deleting: float | None = None,
) -> PodLife:
    return PodLife(
        uid=uid,
        key=f"ml/{uid}",
        cards=(f"{server}/GPU-0",),
        bound_rv=1,
        bound_at=bound,
        end_rv=None if end is None else 2,
        end_at=end,
        deleting_at=deleting,
        deleting_rv=None if deleting is None else 2,
        phase="Running" if end is None else "Succeeded",
    )


def told(*uids: str) -> dict[str, set[str]]:
    return {uid: {"RemoteGPUServerLost"} for uid in uids}


def test_every_holder_told_passes_and_holders_that_left_early_or_elsewhere_do_not_count() -> None:
    pods = [
        holder("stays"),
        holder("left-early", end=101.0),
        holder("came-later", bound=105.0),
        holder("elsewhere", server="gpu-02"),
    ]
    result = check_lost_holders([LOST], pods, told("stays"), KEEP)
    assert result.passed, result.detail
    # The one that left early held the server when it was lost, and left before the deadline.
    assert "1 servers lost, 2 holders" in result.name


def test_a_holder_never_told_fails_naming_it() -> None:
    result = check_lost_holders([LOST], [holder("stays")], {}, KEEP)
    assert not result.passed
    assert "ml/stays held gpu-01 past the deadline without a RemoteGPUServerLost" in result.detail


def test_a_holder_told_something_else_is_not_told() -> None:
    events = {"stays": {"RemoteGPUUnavailable"}}
    assert not check_lost_holders([LOST], [holder("stays")], events, KEEP).passed


def test_with_evict_a_holder_evicted_told_and_run_elsewhere_passes() -> None:
    evicted = holder("p", deleting=105.0, end=106.0)
    again = replace(holder("p-again", server="gpu-02", bound=107.0), key="ml/p-again")
    result = check_lost_holders([LOST], [evicted, again], told("p"), EVICT, {"ml/p": again})
    assert result.passed, result.detail
    assert "told and moved elsewhere" in result.name


@pytest.mark.parametrize(
    ("pods", "events", "again", "said"),
    [
        pytest.param([holder("p")], told("p"), {}, "was not evicted", id="kept"),
        pytest.param(
            [holder("p", deleting=105.0)], {}, {}, "evicted from gpu-01 without", id="untold"
        ),
        pytest.param(
            [holder("p", deleting=105.0)], told("p"), {}, "never ran again", id="not-replaced"
        ),
        pytest.param(
            [holder("p", deleting=105.0)],
            told("p"),
            {"ml/p": holder("p-again", bound=108.0)},
            "placed on lost gpu-01 again",
            id="same-server",
        ),
    ],
)
def test_with_evict_each_way_of_failing_a_holder_is_caught(pods, events, again, said) -> None:
    result = check_lost_holders([LOST], pods, events, EVICT, again)
    assert not result.passed
    assert said in result.detail


def test_with_evict_a_holder_that_finished_on_its_own_before_the_deadline_is_excused() -> None:
    finished = holder("p", end=104.0)
    assert check_lost_holders([LOST], [finished], {}, EVICT).passed


def test_only_deletions_inside_a_lost_window_count_as_lost_evictions() -> None:
    assert lost_at([LOST], holder("p", deleting=111.0))
    assert not lost_at([LOST], holder("p", deleting=90.0))
    assert not lost_at([LOST], holder("p", server="gpu-02", deleting=105.0))
    assert not lost_at([LOST], holder("p"))


def test_events_about_pods_are_recorded_by_uid_and_replacements_found_by_name() -> None:
    evidence = Evidence()
    event = {
        "involvedObject": {"kind": "Pod", "uid": "u1", "name": "p"},
        "reason": "RemoteGPUServerLost",
    }
    evidence.on_event("ADDED", event)
    evidence.on_event("ADDED", {**event, "involvedObject": {"kind": "Node", "uid": "n1"}})
    assert evidence.events == {"u1": {"RemoteGPUServerLost"}}
    evidence.pods["u2"] = replace(holder("u2"), key="ml/p-again")
    assert replacements(evidence) == {"ml/p": evidence.pods["u2"]}
