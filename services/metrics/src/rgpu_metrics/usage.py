"""Who used what: the card-seconds each namespace's claims held, as the Prometheus counter
``rgpu_namespace_card_seconds_total{namespace}``, so ``increase(...[30d]) / 3600`` is that
namespace's card-hours.

The counter integrates the claim set over time: between two changes of the claims, every card
a claim holds (booked, committed or bound: all keep the card from everyone else) adds the
seconds that passed. Only the replica exporting the card families counts, and it counts only
while it exports: a replica that stops exporting forgets its totals, one that starts begins at
zero. So a leader change may reset the counter (Prometheus' ``increase`` handles a reset), and
never doubles it — no two replicas export at once, and none counts time it did not export.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from rgpu_contracts import ClaimSet
from rgpu_placement import cards_by_namespace

__all__ = ["Usage", "UsageCollector", "held_by_namespace"]


def held_by_namespace(claims: ClaimSet) -> dict[str, int]:
    """Cards held per namespace by ``claims``."""
    return cards_by_namespace(claims.claims)


class Usage:
    """Card-seconds per namespace, integrated while ``counting()`` says so."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counting: Callable[[], bool] = lambda: False
        self._held: dict[str, int] = {}
        self._totals: dict[str, float] = {}
        self._since: float | None = None

    def count_while(self, counting: Callable[[], bool]) -> None:
        """Count only while ``counting()`` (this replica exports the card families)."""
        self._counting = counting

    def claims_changed(self, claims: ClaimSet) -> None:
        """The claim set changed: close the interval with what was held, then hold this."""
        self._advance()
        self._held = held_by_namespace(claims)

    def totals(self) -> dict[str, float]:
        """Card-seconds per namespace up to now (empty while not counting)."""
        self._advance()
        return dict(self._totals)

    def _advance(self) -> None:
        now = self._clock()
        if not self._counting():
            self._totals.clear()
            self._since = None
            return
        if self._since is not None:
            elapsed = max(0.0, now - self._since)
            for namespace, cards in self._held.items():
                self._totals[namespace] = self._totals.get(namespace, 0.0) + cards * elapsed
        self._since = now


class UsageCollector(Collector):
    """``rgpu_namespace_card_seconds_total``, read from ``Usage`` at each scrape."""

    def __init__(self, usage: Usage) -> None:
        self._usage = usage

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        totals = self._usage.totals()
        if not totals:
            return
        family = CounterMetricFamily(
            "rgpu_namespace_card_seconds",
            "Card-seconds held by the claims of each namespace's pods, counted by the replica "
            "exporting the card families (a leader change resets it).",
            labels=("namespace",),
        )
        for namespace in sorted(totals):
            family.add_metric((namespace,), totals[namespace])
        yield family
