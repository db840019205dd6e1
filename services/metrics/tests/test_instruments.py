"""Source health is computed when scraped, from the followers' status and the board."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from rgpu_metrics.board import Board
from rgpu_metrics.instruments import SourceCollector
from rgpu_runtime.feeds import FollowStatus

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def collected(board: Board, statuses, clock) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SourceCollector(board, statuses, clock=clock))
    return registry


async def test_age_grows_with_time_between_scrapes_without_any_update():
    discovery = FollowStatus("discovery")
    discovery.last_success, discovery.up = 10.0, True
    clock = Clock(12.5)
    registry = collected(Board(), [discovery], clock)
    get = registry.get_sample_value
    assert get("rgpu_source_age_seconds", {"source": "discovery"}) == 2.5
    clock.now = 40.0
    assert get("rgpu_source_age_seconds", {"source": "discovery"}) == 30.0


async def test_a_source_that_never_answered_is_down_without_an_age():
    allocator = FollowStatus("allocator")
    registry = collected(Board(), [allocator], Clock(5.0))
    assert registry.get_sample_value("rgpu_source_up", {"source": "allocator"}) == 0.0
    assert registry.get_sample_value("rgpu_source_age_seconds", {"source": "allocator"}) is None


async def test_revisions_appear_once_the_board_has_each_snapshot(make):
    board = Board()
    registry = collected(board, [], Clock(0.0))
    assert registry.get_sample_value("rgpu_fleet_revision") is None
    board.set_fleet(make.fleet(revision=7))
    board.set_claims(make.claims(revision=11))
    assert registry.get_sample_value("rgpu_fleet_revision") == 7
    assert registry.get_sample_value("rgpu_claims_revision") == 11


async def test_registering_reads_nothing_from_the_sources():
    class Exploding(Board):
        @property
        def fleet(self):
            raise AssertionError("read at registration")

    registry = CollectorRegistry(auto_describe=True)
    registry.register(SourceCollector(Exploding(), [], clock=Clock(0.0)))
