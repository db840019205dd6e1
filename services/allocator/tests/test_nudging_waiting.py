"""The leader's line of waiting pods: every pending pod gets its turn, least recently nudged
first, none twice within the cool-down, none that already holds a claim."""

from __future__ import annotations

from rgpu_allocator.waiters import COOL_DOWN, Waiting
from rgpu_contracts import PodRef, PodUID


def pod(name: str) -> PodRef:
    return PodRef(uid=PodUID(f"uid-{name}"), namespace="ml", name=name)


def names(pods: list[PodRef]) -> list[str]:
    return [p.name for p in pods]


def never(uid: PodUID) -> bool:
    return False


def test_each_round_takes_the_least_recently_nudged_so_every_pod_gets_its_turn() -> None:
    waiting = Waiting()
    for name in "abcd":
        waiting.track(pod(name), True)
    assert names(waiting.take(2, 10.0, never)) == ["a", "b"]
    assert names(waiting.take(2, 20.0, never)) == ["c", "d"]
    assert names(waiting.take(3, 30.0, never)) == ["a", "b", "c"]


def test_a_pod_nudged_within_the_cool_down_is_left_for_later() -> None:
    waiting = Waiting()
    waiting.track(pod("a"), True)
    assert names(waiting.take(5, 10.0, never)) == ["a"]
    assert waiting.take(5, 10.0 + COOL_DOWN / 2, never) == []
    assert names(waiting.take(5, 10.0 + COOL_DOWN, never)) == ["a"]


def test_pods_that_stop_waiting_or_hold_a_claim_are_not_nudged() -> None:
    waiting = Waiting()
    for name in "abc":
        waiting.track(pod(name), True)
    waiting.track(pod("a"), False)
    assert names(waiting.take(5, 1.0, lambda uid: uid == "uid-b")) == ["c"]
    assert len(waiting) == 2


def test_the_line_is_bounded() -> None:
    waiting = Waiting(limit=2)
    for name in "abc":
        waiting.track(pod(name), True)
    assert len(waiting) == 2


def test_the_first_pod_out_of_its_cool_down_says_when_a_round_may_run_again() -> None:
    waiting = Waiting()
    assert waiting.cooled_at(5.0, never) is None
    for name in "ab":
        waiting.track(pod(name), True)
    assert waiting.cooled_at(5.0, never) == 5.0
    waiting.take(2, 10.0, never)
    assert waiting.cooled_at(10.5, never) == 10.0 + COOL_DOWN
    assert waiting.cooled_at(10.5, lambda uid: True) is None


def test_nominees_come_first_and_skip_the_cool_down() -> None:
    waiting = Waiting()
    for name in "abc":
        waiting.track(pod(name), True)
    assert names(waiting.take(3, 10.0, never)) == ["a", "b", "c"]
    # Capacity freed for "c" half a cool-down later: only the nominee is nudged again.
    later = 10.0 + COOL_DOWN / 2
    assert names(waiting.take(2, later, never, first=frozenset({PodUID("uid-c")}))) == ["c"]
    held = frozenset({PodUID("uid-b")})
    assert waiting.take(2, later, lambda uid: uid in held, first=held) == []
