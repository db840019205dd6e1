"""Each 5xx the fuzz found in code others own, replayed from its minimal input on a fresh stack.

The list lives in ``conftest.KNOWN_BUGS``; each entry runs here as a strict xfail, so the day
its fix lands this test turns red and says the entry (and its tolerance in the fuzz) must go.
A fresh stack per module keeps the replays independent of what the fuzz left behind.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.anyio


async def test_known_bug_still_fails_with_its_minimal_input(stack: Any, known_bug: Any) -> None:
    for request in known_bug.before:
        await stack.send(request, known=())
    await stack.send(known_bug.minimal, known=())
