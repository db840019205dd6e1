from __future__ import annotations

import anyio
import pytest

from rgpu_testkit import eventually

pytestmark = pytest.mark.anyio


async def test_returns_once_a_sync_predicate_turns_true() -> None:
    calls: list[int] = []

    def third_time() -> bool:
        calls.append(1)
        return len(calls) >= 3

    await eventually(third_time, interval=0)
    assert len(calls) == 3


async def test_awaits_an_async_predicate() -> None:
    seen = anyio.Event()

    async def set_later() -> None:
        seen.set()

    async def is_set() -> bool:
        return seen.is_set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(set_later)
        await eventually(is_set)


async def test_a_truthy_value_counts_as_true() -> None:
    await eventually(lambda: ["something"])


async def test_timeout_names_the_awaited_lambda_and_its_last_value() -> None:
    with pytest.raises(AssertionError) as caught:
        await eventually(lambda: [] * 2, timeout=0.05)
    message = str(caught.value)
    assert "still false after 0.05 s" in message
    assert "lambda: [] * 2" in message
    assert "last value: []" in message
    assert isinstance(caught.value.__cause__, TimeoutError)


async def test_timeout_uses_what_when_given() -> None:
    with pytest.raises(AssertionError, match="the informer synced"):
        await eventually(lambda: False, timeout=0.02, what="the informer synced")


async def test_timeout_names_a_named_function() -> None:
    def never_ready() -> bool:
        return False

    with pytest.raises(AssertionError, match="never_ready"):
        await eventually(never_ready, timeout=0.02)
