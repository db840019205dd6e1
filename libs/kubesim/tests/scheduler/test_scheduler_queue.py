"""kube-scheduler's queueing rules, checked on the queue alone with a fake clock."""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import pytest

from rgpu_kubesim.scheduler._queue import SchedulingQueue


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def queue(clock: Clock) -> SchedulingQueue:
    """The rules before SchedulerPopFromBackoffQ (Kubernetes < 1.33): backoff is served whole."""
    return SchedulingQueue(
        initial_backoff=1.0,
        max_backoff=10.0,
        flush_after=300.0,
        pop_from_backoff=False,
        clock=clock,
    )


@pytest.fixture
def idle_pops(clock: Clock) -> SchedulingQueue:
    """kube-scheduler's default since 1.33: an idle scheduler takes pods from backoffQ."""
    return SchedulingQueue(
        initial_backoff=1.0, max_backoff=10.0, flush_after=300.0, pop_from_backoff=True, clock=clock
    )


def fail(queue: SchedulingQueue, uid: str, *, unschedulable: bool) -> None:
    assert queue.pop() == uid
    queue.failed(uid, unschedulable=unschedulable)


def test_backoff_starts_at_one_second_and_doubles_to_the_cap(queue: SchedulingQueue) -> None:
    durations = [queue.backoff_seconds(attempts) for attempts in range(1, 8)]
    assert durations == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_pods_pop_by_priority_then_by_arrival(queue: SchedulingQueue, clock: Clock) -> None:
    queue.add("low-early", 0)
    clock.now += 1
    queue.add("high", 100)
    clock.now += 1
    queue.add("low-late", 0)
    assert [queue.pop(), queue.pop(), queue.pop(), queue.pop()] == [
        "high",
        "low-early",
        "low-late",
        None,
    ]


def test_adding_a_known_pod_again_does_not_queue_it_twice(queue: SchedulingQueue) -> None:
    queue.add("p")
    queue.add("p")
    assert queue.pop() == "p"
    queue.add("p")
    assert (queue.pop(), queue.state("p")) == (None, "in-flight")


def test_an_error_waits_out_a_doubling_backoff(queue: SchedulingQueue, clock: Clock) -> None:
    queue.add("p")
    for expected in (1.0, 2.0, 4.0, 8.0, 10.0, 10.0):
        fail(queue, "p", unschedulable=False)
        assert queue.state("p") == "backoff"
        assert queue.next_due() == pytest.approx(clock.now + expected)
        clock.now += expected - 0.001
        assert queue.pop() is None
        clock.now += 0.001


def test_an_unschedulable_pod_waits_for_a_move_not_for_its_backoff(
    queue: SchedulingQueue, clock: Clock
) -> None:
    queue.add("p")
    fail(queue, "p", unschedulable=True)
    clock.now += 60
    assert (queue.pop(), queue.state("p")) == (None, "unschedulable")
    assert queue.move_all() == 1
    assert queue.pop() == "p"


def test_a_moved_pod_serves_the_rest_of_its_backoff_first(
    queue: SchedulingQueue, clock: Clock
) -> None:
    queue.add("p")
    fail(queue, "p", unschedulable=False)
    clock.now += 1
    fail(queue, "p", unschedulable=True)
    clock.now += 0.5
    queue.move_all()
    assert (queue.state("p"), queue.pop()) == ("backoff", None)
    clock.now += 1.5
    assert queue.pop() == "p"


def test_an_update_of_the_pod_moves_only_that_pod(queue: SchedulingQueue, clock: Clock) -> None:
    queue.add("a")
    queue.add("b")
    fail(queue, "a", unschedulable=True)
    fail(queue, "b", unschedulable=True)
    clock.now += 5
    queue.updated("b")
    assert (queue.pop(), queue.state("a")) == ("b", "unschedulable")


def test_an_update_while_waiting_in_backoff_leaves_the_pod_there(
    queue: SchedulingQueue, clock: Clock
) -> None:
    queue.add("p")
    fail(queue, "p", unschedulable=False)
    queue.updated("p")
    assert (queue.state("p"), queue.pop()) == ("backoff", None)


@pytest.mark.parametrize("move", ["cluster event", "pod update"])
def test_a_move_during_the_attempt_turns_the_refusal_into_a_backoff(
    queue: SchedulingQueue, clock: Clock, move: str
) -> None:
    queue.add("p")
    assert queue.pop() == "p"
    if move == "cluster event":
        queue.move_all()
    else:
        queue.updated("p")
    queue.failed("p", unschedulable=True)
    assert queue.state("p") == "backoff"
    clock.now += 1
    assert queue.pop() == "p"
    queue.failed("p", unschedulable=True)
    assert queue.state("p") == "unschedulable", "the move was consumed by the earlier attempt"


def test_unschedulable_pods_are_flushed_after_the_period_oldest_first(
    queue: SchedulingQueue, clock: Clock
) -> None:
    queue.add("old")
    queue.add("new")
    fail(queue, "old", unschedulable=True)
    clock.now += 100
    fail(queue, "new", unschedulable=True)
    assert queue.next_due() == pytest.approx(clock.now + 200)
    clock.now += 200
    assert (queue.pop(), queue.pop()) == ("old", None)
    assert queue.next_due() == pytest.approx(clock.now + 100)
    clock.now += 100
    assert queue.pop() == "new"


@pytest.mark.parametrize("where", ["active", "backoff", "unschedulable", "in-flight"])
def test_a_forgotten_pod_never_comes_back(queue: SchedulingQueue, clock: Clock, where: str) -> None:
    queue.add("p")
    if where != "active":
        assert queue.pop() == "p"
    if where in ("backoff", "unschedulable"):
        queue.failed("p", unschedulable=where == "unschedulable")
    queue.forget("p")
    queue.failed("p", unschedulable=False)
    queue.move_all()
    clock.now += 1000
    assert (queue.pop(), queue.state("p"), "p" in queue) == (None, None, False)


def test_an_assumed_pod_is_untouched_by_moves_and_backs_off_if_binding_fails(
    queue: SchedulingQueue, clock: Clock
) -> None:
    queue.add("p")
    assert queue.pop() == "p"
    queue.assume("p")
    queue.move_all()
    assert queue.state("p") == "assumed"
    queue.failed("p", unschedulable=False)
    assert queue.state("p") == "backoff"


def test_next_due_is_none_when_nothing_waits_on_time(queue: SchedulingQueue) -> None:
    queue.add("p")
    assert queue.next_due() is None
    fail(queue, "p", unschedulable=True)
    assert queue.next_due() is not None


@pytest.mark.anyio
async def test_wait_returns_when_a_pod_is_added() -> None:
    queue = SchedulingQueue(initial_backoff=1.0, max_backoff=10.0, flush_after=300.0)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(queue.wait)
            await anyio.sleep(0.01)
            queue.add("p")
    assert queue.pop() == "p"


@pytest.mark.anyio
async def test_wait_returns_at_the_next_due_time_without_any_change() -> None:
    queue = SchedulingQueue(
        initial_backoff=0.05, max_backoff=1.0, flush_after=300.0, pop_from_backoff=False
    )
    queue.add("p")
    assert queue.pop() == "p"
    queue.failed("p", unschedulable=False)
    with anyio.fail_after(2):
        await queue.wait()
    assert queue.pop() == "p"


def test_an_idle_scheduler_takes_a_moved_pod_before_its_backoff_ends(
    idle_pops: SchedulingQueue, clock: Clock
) -> None:
    idle_pops.add("p")
    fail(idle_pops, "p", unschedulable=True)
    clock.now += 0.5
    idle_pops.move_all()
    assert idle_pops.state("p") == "backoff"
    assert idle_pops.pop() == "p"


def test_an_idle_scheduler_takes_a_pod_refused_during_a_move_at_once(
    idle_pops: SchedulingQueue,
) -> None:
    idle_pops.add("p")
    assert idle_pops.pop() == "p"
    idle_pops.updated("p")
    idle_pops.failed("p", unschedulable=True)
    assert (idle_pops.state("p"), idle_pops.pop()) == ("backoff", "p")


def test_active_pods_go_before_pods_in_backoff(idle_pops: SchedulingQueue) -> None:
    idle_pops.add("a")
    idle_pops.add("b")
    fail(idle_pops, "a", unschedulable=True)
    idle_pops.move_all()
    assert [idle_pops.pop(), idle_pops.pop()] == ["b", "a"]


def test_a_pod_that_failed_with_an_error_keeps_its_whole_backoff(
    idle_pops: SchedulingQueue, clock: Clock
) -> None:
    idle_pops.add("p")
    fail(idle_pops, "p", unschedulable=False)
    assert (idle_pops.state("p"), idle_pops.pop()) == ("backoff", None)
    clock.now = 101.999
    assert idle_pops.pop() is None
    clock.now = 102.0
    assert idle_pops.pop() == "p"


def test_backoff_ends_at_the_start_of_the_window_after_its_expiry(
    idle_pops: SchedulingQueue, clock: Clock
) -> None:
    clock.now = 100.3
    idle_pops.add("p")
    fail(idle_pops, "p", unschedulable=False)
    assert idle_pops.next_due() == pytest.approx(102.0)


def test_pods_in_backoff_are_taken_by_window_then_priority_then_age(
    idle_pops: SchedulingQueue, clock: Clock
) -> None:
    idle_pops.add("low", 0)
    idle_pops.add("high", 10)
    fail(idle_pops, "high", unschedulable=True)
    fail(idle_pops, "low", unschedulable=True)
    idle_pops.add("later", 100)
    clock.now = 101.0
    fail(idle_pops, "later", unschedulable=True)
    idle_pops.move_all()
    assert [idle_pops.pop() for _ in range(4)] == ["high", "low", "later", None]


def test_a_stale_entry_falling_due_releases_no_pod_before_its_time(
    queue: SchedulingQueue, clock: Clock
) -> None:
    queue.add("gone")
    queue.add("later")
    fail(queue, "gone", unschedulable=False)
    clock.now += 0.5
    fail(queue, "later", unschedulable=False)
    queue.forget("gone")
    clock.now = 101.2
    assert (queue.pop(), queue.state("later")) == (None, "backoff")
    clock.now = 101.5
    assert queue.pop() == "later"
