"""The exporter's own series: the process's, and how fresh the exported picture is.

Freshness must be computed when scraped: ``rgpu_source_age_seconds`` grows while a source is
away, and a stored gauge would only change when the follower runs, so this collector reads the
followers' status and the board at scrape time instead. It lives on the app's own registry
beside the process and latency metrics; the card families are rendered by the board (see
``rendering``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rgpu_runtime.feeds import FollowStatus

from .board import Board

__all__ = ["SourceCollector", "register_process"]


def register_process(registry: CollectorRegistry) -> None:
    """Add the process, platform and garbage-collector families to the app's own registry.

    A fresh ``CollectorRegistry`` carries none of them, unlike prometheus_client's default one.
    """
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


class SourceCollector(Collector):
    """Source health and snapshot revisions, read from memory at each scrape."""

    def __init__(
        self,
        board: Board,
        statuses: Sequence[FollowStatus],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._board = board
        self._statuses = tuple(statuses)
        self._clock = clock

    def describe(self) -> Iterable[Metric]:
        """Nothing to pre-declare: registering must not read state that is still empty."""
        return ()

    def collect(self) -> Iterable[Metric]:
        """Yield the source families and the revisions of the snapshots being exported."""
        yield self._ages()
        yield self._up()
        yield from self._revisions()

    def _ages(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "rgpu_source_age_seconds",
            "Seconds since the source last answered (a quiet source answers every long-poll).",
            labels=("source",),
        )
        now = self._clock()
        for status in self._statuses:
            age = status.age(now)
            if age is not None:
                family.add_metric((status.name,), age)
        return family

    def _up(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "rgpu_source_up",
            "1 when the source's last call succeeded, else 0 (its last snapshot is still served).",
            labels=("source",),
        )
        for status in self._statuses:
            family.add_metric((status.name,), float(status.up))
        return family

    def _revisions(self) -> Iterable[GaugeMetricFamily]:
        fleet, claims = self._board.fleet, self._board.claims
        if fleet is not None:
            yield GaugeMetricFamily(
                "rgpu_fleet_revision", "Revision of the fleet being exported.", value=fleet.revision
            )
        if claims is not None:
            yield GaugeMetricFamily(
                "rgpu_claims_revision",
                "Revision of the claim set being exported.",
                value=claims.revision,
            )
