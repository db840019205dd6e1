from __future__ import annotations

import anyio
import pytest

from rgpu_runtime.feeds import Versioned

pytestmark = pytest.mark.anyio


async def test_wait_newer_returns_at_once_when_the_caller_is_behind() -> None:
    fleet = Versioned("a")
    fleet.publish("b")
    with anyio.fail_after(0.5):
        assert await fleet.wait_newer(1, timeout=30) == (2, "b")


async def test_wait_newer_from_a_revision_ahead_waits_until_the_value_passes_it() -> None:
    fleet = Versioned("a")
    results: list[tuple[int, str]] = []

    async def wait() -> None:
        results.append(await fleet.wait_newer(3, timeout=30))

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            for value in ("b", "c"):
                await anyio.wait_all_tasks_blocked()
                fleet.publish(value)
                assert results == []
            await anyio.wait_all_tasks_blocked()
            fleet.publish("d", revision=9)
    assert results == [(9, "d")]


async def test_wait_newer_from_a_revision_ahead_answers_the_lower_one_only_after_the_wait() -> None:
    fleet = Versioned("a")
    started = anyio.current_time()
    assert await fleet.wait_newer(999, timeout=0.05) == (1, "a")
    assert anyio.current_time() - started >= 0.05


def test_publish_to_a_revision_that_does_not_move_forward_is_refused() -> None:
    fleet = Versioned("a", revision=10)
    with pytest.raises(ValueError, match="does not follow 10"):
        fleet.publish("b", revision=10)
    assert fleet.publish("b", revision=25) == 25


async def test_publish_wakes_every_waiter_with_the_new_value() -> None:
    fleet = Versioned("old")
    results: list[tuple[int, str]] = []

    async def wait() -> None:
        results.append(await fleet.wait_newer(1, timeout=30))

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert results == []
            assert fleet.publish("new") == 2
    assert results == [(2, "new")] * 50


async def test_wait_newer_times_out_with_the_unchanged_snapshot() -> None:
    fleet = Versioned(["x"])
    started = anyio.current_time()
    assert await fleet.wait_newer(1, timeout=0.05) == (1, ["x"])
    assert anyio.current_time() - started >= 0.05


async def test_waiters_after_a_publish_wait_for_the_next_one() -> None:
    fleet = Versioned(0)
    fleet.publish(1)
    results: list[tuple[int, int]] = []

    async def wait() -> None:
        results.append(await fleet.wait_newer(2, timeout=30))

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            fleet.publish(2)
    assert results == [(3, 2)]


def test_publish_without_waiters_needs_no_event_loop() -> None:
    fleet = Versioned("a", revision=10)
    assert fleet.publish("b") == 11
    assert fleet.snapshot() == (11, "b")
    assert (fleet.revision, fleet.value) == (11, "b")
