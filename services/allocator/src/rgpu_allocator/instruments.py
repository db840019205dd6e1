"""An operator must see how the allocator decides and where it
struggles (refusals by reason, compare-and-swap contention, sweeps, repairs, latency) from
its own ``/metrics``, on the app's registry, never the process-global one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rgpu_contracts import ClaimState
from rgpu_placement import FleetView
from rgpu_runtime.feeds import DiscoveryMirror

from .ledger import Ledger
from .pods import PodIndex

__all__ = ["ADMISSION_OUTCOMES", "REPAIR_OUTCOMES", "Instruments"]

REPAIR_OUTCOMES = ("repaired", "refused_untrusted")
"""Every outcome is exported from the start, so an alert on refusals has a series at 0."""

ADMISSION_OUTCOMES = ("admitted", "lapsed")
_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
_DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class _StateCollector(Collector):
    """Gauges read at scrape time from the live state (no bookkeeping on the hot path)."""

    def __init__(
        self, ledger: Ledger, pods: PodIndex, discovery: DiscoveryMirror[FleetView]
    ) -> None:
        self._ledger = ledger
        self._pods = pods
        self._discovery = discovery

    def collect(self) -> Iterator[Metric]:
        states = Counter(c.state for r in self._ledger.leases() for c in r.claims)
        claims = GaugeMetricFamily(
            "rgpu_allocator_claims", "Claims stored in Leases, by state.", labels=["state"]
        )
        for state in ClaimState:
            claims.add_metric([state.value], states.get(state, 0))
        yield claims
        yield GaugeMetricFamily("rgpu_allocator_pods", "Pods in the watch cache.", len(self._pods))
        yield GaugeMetricFamily(
            "rgpu_allocator_leases", "Claim Leases in the cache.", len(self._ledger)
        )
        age = self._discovery.fleet_age()
        yield GaugeMetricFamily(
            "rgpu_allocator_fleet_age_seconds",
            "Seconds since discovery last answered with the fleet (-1 before the first).",
            -1.0 if age is None else age,
        )


class Instruments:
    """The allocator's self-metrics, registered on one ``CollectorRegistry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        ledger: Ledger,
        pods: PodIndex,
        discovery: DiscoveryMirror[FleetView],
    ) -> None:
        registry.register(_StateCollector(ledger, pods, discovery))
        self.decisions = PromCounter(
            "rgpu_allocator_decisions",
            "Allocation decisions by outcome (allocated, reused, refused, dry_run) and reason.",
            ["outcome", "reason"],
            registry=registry,
        )
        self.cas_conflicts = PromCounter(
            "rgpu_allocator_cas_conflicts",
            "Lease writes that lost a compare-and-swap race, by operation.",
            ["operation"],
            registry=registry,
        )
        self.sweep_removals = PromCounter(
            "rgpu_allocator_sweep_removals",
            "Invalid claims removed, by why (deleted, finished, expired, duplicate, gone).",
            ["reason"],
            registry=registry,
        )
        self.repairs = PromCounter(
            "rgpu_allocator_repairs",
            "Repairs from a bound pod's allocated-devices annotation, by outcome: repaired (the "
            "claim restored) or refused_untrusted (the pod or its annotation cannot be trusted; "
            "an Event on the pod says why, nothing booked).",
            ["outcome"],
            registry=registry,
        )
        for outcome in REPAIR_OUTCOMES:
            self.repairs.labels(outcome=outcome)
        self.repair_conflicts = PromCounter(
            "rgpu_allocator_repair_conflicts",
            "Repairs refused because another pod holds the cards (reported as Events).",
            registry=registry,
        )
        self.nudges = PromCounter(
            "rgpu_allocator_nudges",
            "Refused pods annotated with rgpu.io/retry-at so kube-scheduler retries them.",
            registry=registry,
        )
        self.decision_seconds = Histogram(
            "rgpu_allocator_decision_seconds",
            "Time to choose a server, excluding apiserver writes.",
            buckets=_DECISION_BUCKETS,
            registry=registry,
        )
        self.reprobes = PromCounter(
            "rgpu_allocator_reprobes",
            "Busy servers re-probed through discovery before a refusal, by outcome (answered, "
            "not_probed, unavailable, over_budget).",
            ["outcome"],
            registry=registry,
        )
        self.preemptions = PromCounter(
            "rgpu_allocator_preemptions",
            "Preemption attempts for refused pods of higher priority, by outcome (nominated, "
            "pending, none, blocked, failed, partial, resumed).",
            ["outcome"],
            registry=registry,
        )
        self.preemption_victims = PromCounter(
            "rgpu_allocator_preemption_victims",
            "Pods evicted to free a server for a pod of higher priority.",
            registry=registry,
        )
        self.admissions = PromCounter(
            "rgpu_admissions",
            "Gated pods admitted (a server booked, rgpu's scheduling gate lifted), and admitted "
            "bookings that lapsed before the pod was bound (the pod then takes the filter "
            "path), by outcome.",
            ["outcome"],
            registry=registry,
        )
        for outcome in ADMISSION_OUTCOMES:
            self.admissions.labels(outcome=outcome)
        self.admission_wait_seconds = Histogram(
            "rgpu_admission_wait_seconds",
            "Seconds from a gated pod's creation until rgpu lifted its gate.",
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.watch_restarts = PromCounter(
            "rgpu_allocator_watch_restarts",
            "Relists after a watch failed or expired, by resource.",
            ["resource"],
            registry=registry,
        )
