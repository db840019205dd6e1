"""A soak's arithmetic: the stream paced to what the fleet carries, the deadline following the
work, and a run that cannot finish said before it starts."""

from __future__ import annotations

import pytest

from rgpu_sim.soak_plan import plan_soak
from rgpu_sim.soak_sizing import LOAD, fleet_problems, pace, size
from rgpu_sim.soak_workload import WorkloadShape, plan_soak_workload
from rgpu_sim.stack import StackOptions

EIGHT = [[81920] * 4] * 8


def test_a_stream_the_fleet_cannot_carry_is_slowed_to_the_load_and_keeps_its_pods() -> None:
    shape = WorkloadShape(pods=2000, seed=77)
    paced = pace(shape, servers=EIGHT, granularity="server")
    assert paced.mean_gap_seconds > shape.mean_gap_seconds
    before, after = plan_soak_workload(shape), plan_soak_workload(paced)
    assert [p.containers for p in before] == [p.containers for p in after]
    sized = size(after, servers=EIGHT, granularity="server", gap_seconds=paced.mean_gap_seconds)
    assert sized.load == pytest.approx(LOAD, abs=0.01)


def test_a_stream_the_fleet_carries_keeps_its_rate() -> None:
    shape = WorkloadShape(pods=2000, seed=77)
    assert pace(shape, servers=EIGHT, granularity="card") == shape


def test_the_deadline_follows_the_work_and_one_set_shorter_cannot_finish() -> None:
    plans = plan_soak_workload(WorkloadShape(pods=1000, seed=1))
    sized = size(plans, servers=EIGHT, granularity="server", gap_seconds=0.2)
    assert sized.need_seconds == pytest.approx(sized.work_seconds / 8)
    assert sized.deadline_seconds > 2 * sized.need_seconds
    assert sized.problem() is None
    short = size(plans, servers=EIGHT, granularity="server", gap_seconds=0.2, timeout_seconds=60)
    problem = short.problem()
    assert problem is not None
    assert f"takes at least {sized.need_seconds:.0f}s" in problem


def test_pods_no_server_could_take_are_named_before_the_run() -> None:
    plans = plan_soak_workload(WorkloadShape(pods=400, seed=3))
    three = [[81920] * 3] * 8
    assert fleet_problems(plans, servers=three, granularity="server") == []
    [problem] = fleet_problems(plans, servers=three, granularity="card")
    assert "ask for more cards at once than any server has healthy (3 at most" in problem


def test_the_plan_of_the_documented_sizes_can_finish() -> None:
    # The CI soak's size and make soak's, in both granularities.
    for granularity, pods in (("server", 200), ("server", 5000), ("card", 5000)):
        stack = StackOptions(servers=8, cards=4, seed=77, granularity=granularity)
        plan = plan_soak(stack, WorkloadShape(pods=pods, seed=77, priority_share=0.1), queues=True)
        assert plan.problems == ()
        assert plan.sizing.load <= LOAD + 0.01
        assert plan.queues is not None
        assert {p.namespace for p in plan.pods} == {"default", "team-a", "team-b"}
        assert any(p.gang for p in plan.pods)
