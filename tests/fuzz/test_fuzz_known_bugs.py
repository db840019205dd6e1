"""Every 5xx the fuzz found, replayed from its minimal input on a fresh stack: each must now
be answered below 500 within the time bound, with the service still ready after.

The list lives in ``conftest.FIXED_BUGS`` (bugs the fuzz found and that were then fixed). A
fresh stack per module keeps the replays independent of what the fuzz left behind.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.anyio


async def test_a_bug_the_fuzz_found_stays_fixed_for_its_minimal_input(
    stack: Any, fixed_bug: Any
) -> None:
    for request in fixed_bug.before:
        await stack.send(request, known=())
    await stack.send(fixed_bug.minimal, known=())
