from __future__ import annotations

import pytest

from rgpu_runtime.pacing import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_starts_full_and_refuses_once_its_burst_is_spent() -> None:
    bucket = TokenBucket(1.0, burst=3, clock=FakeClock())
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]


def test_a_dry_bucket_refills_at_its_rate_but_never_beyond_its_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2.0, burst=3, clock=clock)
    while bucket.take():
        pass
    clock.now += 0.5
    assert bucket.take()
    assert not bucket.take()
    clock.now += 3600
    assert bucket.tokens == 3.0


def test_the_burst_defaults_to_one_seconds_worth_of_tokens() -> None:
    bucket = TokenBucket(5.0, clock=FakeClock())
    assert bucket.tokens == 5.0


def test_a_clock_stepping_back_adds_no_tokens() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1.0, burst=1, clock=clock)
    assert bucket.take()
    clock.now -= 50
    assert not bucket.take()


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.5)])
def test_a_bucket_that_could_never_grant_a_token_is_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="rate > 0 and burst >= 1"):
        TokenBucket(rate, burst=burst)
