"""Readiness: started and blocked by nobody; a background part blocks it only once it has kept
failing for its patience, and a success unblocks it. The parts that use it (the election and
the membership) are tried against an apiserver without the system namespace in their tests."""

from __future__ import annotations

from rgpu_runtime.serving import Readiness
from rgpu_runtime.serving._readiness import Standing


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_ready_needs_the_start_and_no_block() -> None:
    readiness = Readiness()
    assert (readiness.ready, readiness.reason) == (False, "starting")
    readiness.block("election x", "cannot elect")
    readiness.set_ready()
    assert (readiness.ready, readiness.reason) == (False, "cannot elect")
    readiness.unblock("election x")
    assert (readiness.ready, readiness.reason) == (True, "")


def test_the_lifespans_own_reason_comes_first() -> None:
    readiness = Readiness()
    readiness.block("membership", "not a member")
    readiness.set_not_ready("waiting for the first Node list")
    assert readiness.reason == "waiting for the first Node list"


def test_a_part_blocks_only_after_failing_for_its_patience_and_a_success_clears_it() -> None:
    readiness, clock = Readiness(), Clock()
    readiness.set_ready()
    standing = Standing(readiness, "election", clock)
    standing.failed("apiserver 503", patience=10.0)
    clock.now += 9.0
    standing.failed("apiserver 503", patience=10.0)
    assert readiness.ready
    clock.now += 1.0
    standing.failed("apiserver 503", patience=10.0)
    assert (readiness.ready, readiness.reason) == (False, "apiserver 503")
    standing.succeeded()
    assert readiness.ready
    # Patience counts from the first failure after a success, not from the first ever.
    standing.failed("apiserver 503", patience=10.0)
    assert readiness.ready


def test_no_patience_blocks_at_the_first_failure() -> None:
    readiness = Readiness()
    readiness.set_ready()
    Standing(readiness, "membership", Clock()).failed("no namespace", patience=0.0)
    assert readiness.reason == "no namespace"


def test_a_part_without_readiness_only_keeps_time() -> None:
    Standing(None, "election", Clock()).failed("whatever", patience=0.0)
