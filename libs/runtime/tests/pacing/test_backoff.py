from __future__ import annotations

import random

import pytest

from rgpu_runtime.pacing import Backoff


def test_ceiling_doubles_from_initial_up_to_maximum() -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, multiplier=2.0)
    assert [backoff.ceiling(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_delay_stays_within_the_jitter_band_for_every_attempt() -> None:
    backoff = Backoff(initial=0.05, maximum=10.0, jitter=0.5)
    rng = random.Random(7)
    for attempt in range(200):
        ceiling = backoff.ceiling(attempt)
        for _ in range(20):
            delay = backoff.delay(attempt, rng)
            assert ceiling * 0.5 <= delay <= ceiling <= 10.0


def test_delay_actually_varies_with_jitter() -> None:
    backoff = Backoff(jitter=0.5)
    rng = random.Random(1)
    assert len({backoff.delay(3, rng) for _ in range(10)}) > 1


def test_no_jitter_gives_the_ceiling_exactly() -> None:
    assert Backoff(initial=1.0, maximum=8.0, jitter=0.0).delay(2) == 4.0


def test_huge_attempt_numbers_do_not_overflow() -> None:
    assert Backoff(maximum=30.0).ceiling(10**6) == 30.0


def test_multiplier_one_is_a_constant_delay() -> None:
    assert Backoff(initial=0.5, multiplier=1.0).ceiling(1000) == 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0.0},
        {"initial": 5.0, "maximum": 1.0},
        {"multiplier": 0.5},
        {"jitter": 1.5},
    ],
)
def test_nonsense_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="Backoff needs"):
        Backoff(**kwargs)
