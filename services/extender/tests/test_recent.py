"""Filter's bookings, kept for the prioritize that follows: by uid, briefly, bounded."""

from __future__ import annotations

from rgpu_extender.recent import KEEP_SECONDS, RecentBookings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_booking_is_known_until_it_is_older_than_the_keeping_time() -> None:
    clock = Clock()
    recent = RecentBookings(clock=clock)
    recent.remember("uid-1", "gpu-a")
    clock.now += KEEP_SECONDS - 0.1
    assert recent.server_of("uid-1") == "gpu-a"
    clock.now += 0.1
    assert recent.server_of("uid-1") is None


def test_a_newer_booking_replaces_the_older_and_a_refusal_forgets_it() -> None:
    recent = RecentBookings(clock=Clock())
    recent.remember("uid-1", "gpu-a")
    recent.remember("uid-1", "gpu-b")
    assert recent.server_of("uid-1") == "gpu-b"
    recent.forget("uid-1")
    recent.forget("uid-unknown")
    assert recent.server_of("uid-1") is None


def test_the_oldest_pods_go_first_past_the_bound() -> None:
    recent = RecentBookings(clock=Clock(), kept=2)
    for uid in ("a", "b", "a", "c"):
        recent.remember(uid, f"server-{uid}")
    assert [recent.server_of(u) for u in ("a", "b", "c")] == ["server-a", None, "server-c"]
