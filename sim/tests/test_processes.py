from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rgpu_sim.processes import ProcessGroup

pytestmark = [pytest.mark.process, pytest.mark.anyio]

# Prints once SIGTERM is ignored, so the test knows the stubbornness is in place.
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(1, flush=True); time.sleep(600)"
)
SLEEPER = "import time; time.sleep(600)"


@pytest.fixture
def group() -> Iterator[ProcessGroup]:
    group = ProcessGroup()
    yield group
    for process in group.members:
        process.kill()
        process.wait()


def _spawn(group: ProcessGroup, code: str) -> subprocess.Popen[bytes]:
    with open(os.devnull, "wb") as log:
        return group.spawn([sys.executable, "-c", code], env=os.environ, log=log)


async def test_members_share_one_group_of_their_own(group: ProcessGroup) -> None:
    first, second = _spawn(group, SLEEPER), _spawn(group, SLEEPER)
    assert os.getpgid(first.pid) == os.getpgid(second.pid) == group.pgid == first.pid
    assert group.pgid != os.getpgrp()
    await group.stop()
    assert first.poll() is not None
    assert second.poll() is not None


async def test_a_member_ignoring_sigterm_is_killed_after_the_grace(group: ProcessGroup) -> None:
    readable, writable = os.pipe()
    with os.fdopen(writable, "wb") as log:
        process = group.spawn([sys.executable, "-c", STUBBORN], env=os.environ, log=log)
    with os.fdopen(readable, "rb") as output:
        assert output.readline() == b"1\n"
        await group.stop(grace=0.1)
        assert process.poll() == -9, output.read()


async def test_a_group_whose_members_all_ended_is_made_anew(group: ProcessGroup) -> None:
    first = _spawn(group, SLEEPER)
    await group.stop()
    second = _spawn(group, SLEEPER)
    assert group.pgid == second.pid != first.pid
    assert os.getpgid(second.pid) == second.pid
