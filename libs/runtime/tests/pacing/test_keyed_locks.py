"""Work on one key goes one at a time; idle keys cost nothing."""

from __future__ import annotations

import anyio
import pytest

from rgpu_runtime.pacing import KeyedLocks

pytestmark = pytest.mark.anyio


async def test_keyed_locks_serialise_one_key_and_forget_idle_keys():
    locks = KeyedLocks()
    order: list[str] = []

    async def work(name: str, key: str, pause: float) -> None:
        async with locks.hold(key):
            order.append(f"{name}+")
            await anyio.sleep(pause)
            order.append(f"{name}-")

    async with anyio.create_task_group() as tg:
        tg.start_soon(work, "a", "k", 0.05)
        await anyio.sleep(0.01)
        tg.start_soon(work, "b", "k", 0.0)
        tg.start_soon(work, "c", "other", 0.0)
    assert order.index("a-") < order.index("b+")
    assert order.index("c+") < order.index("a-")
    assert len(locks) == 0
