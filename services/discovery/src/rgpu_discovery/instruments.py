"""Discovery's own health must be visible on its ``/metrics`` — how
big the fleet is and in what state, how probes go, how often the Node watch restarts and why —
on the app's own registry, so two apps in one process (tests) never share a series.

Fleet sizes are computed at scrape time from the published snapshots, so they can never drift
from what ``GET /v1/fleet`` serves.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rgpu_contracts.fleet import Server
from rgpu_contracts.ids import ServerName
from rgpu_runtime.telemetry import trace_exemplar

from .fleet import FleetState
from .lupine import ProbeOutcome, ProbeResult
from .topology import TopologyState

__all__ = [
    "RESTART_CAUSES",
    "VERSION_RESULTS",
    "WRITE_OUTCOMES",
    "WRITE_REASONS",
    "Instruments",
    "OnDemandOutcome",
]

RESTART_CAUSES = ("expired", "error")
"""Why the Node watch started over: ``expired`` (410, relist) or ``error`` (backoff)."""
OnDemandOutcome = Literal["probed", "coalesced", "rate_limited"]
"""How an on-demand probe request was served: ``probed`` (it started a probe), ``coalesced``
(it shared a probe already in flight), ``rate_limited`` (the server was probed moments ago,
so the current state was the answer)."""
_EVENT_OUTCOMES = ("posted", "failed", "dropped")
WRITE_REASONS = ("change", "heartbeat")
"""Why a probe state Lease was written: its content changed, or its heartbeat was due."""
WRITE_OUTCOMES = ("written", "conflict", "error", "deferred")
"""``written``; ``conflict`` (409: someone wrote first, re-read and decided again);
``error`` (the apiserver failed: the state stays pending and is retried); ``deferred`` (the
write budget was spent: a change waits, a heartbeat waits for the next probe)."""
VERSION_RESULTS = ("answered", "unanswered")
"""Whether a CUDA version question got a usable version back."""
_PROBE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8)
"""Seconds; a healthy lupine answers within milliseconds, a hung one at the probe timeout."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Instruments:
    """The counters and histograms discovery updates as it works."""

    probes: Counter
    probe_seconds: Histogram
    probe_connections: Counter
    on_demand: Counter
    watch_restarts: Counter
    apiserver_errors: Counter
    events: Counter
    state_writes: Counter
    version_queries: Counter
    members: Gauge
    owned: Gauge
    stale: Gauge

    @classmethod
    def create(
        cls, registry: CollectorRegistry, fleet: FleetState, topology: TopologyState
    ) -> Instruments:
        """Register every series on ``registry``; fleet sizes are read from the states."""
        registry.register(_StateCollector(fleet, topology))
        instruments = cls(
            probes=_counter(registry, "probes_total", "Lupine probes by result.", "result"),
            probe_seconds=Histogram(
                "rgpu_discovery_probe_duration_seconds",
                "Time one lupine probe took, fallback included.",
                registry=registry,
                buckets=_PROBE_BUCKETS,
            ),
            probe_connections=_counter(
                registry,
                "probe_connections_total",
                "Connections probes opened on each server's lupine port (each one costs the "
                "GPU host a process).",
                "server",
            ),
            on_demand=_counter(
                registry,
                "on_demand_probes_total",
                "On-demand probe requests (POST /v1/servers/{name}/probe) by outcome.",
                "outcome",
            ),
            watch_restarts=_counter(
                registry, "watch_restarts_total", "Node list+watch restarts by cause.", "cause"
            ),
            apiserver_errors=_counter(
                registry,
                "apiserver_errors_total",
                "Failed Kubernetes API calls by operation and error code.",
                "operation",
                "code",
            ),
            events=_counter(
                registry,
                "node_events_total",
                "Kubernetes Events about server Nodes by outcome.",
                "outcome",
            ),
            state_writes=_counter(
                registry,
                "state_writes_total",
                "Probe state Lease writes to the apiserver by reason and outcome.",
                "reason",
                "outcome",
            ),
            version_queries=_counter(
                registry,
                "version_queries_total",
                "HTTP/2 HEAD / questions for lupine's CUDA version, by whether a version came "
                "back (each costs the GPU host a connection, counted with the probes').",
                "result",
            ),
            members=Gauge(
                "rgpu_discovery_members",
                "Live discovery replicas dividing the servers, as this replica sees them.",
                registry=registry,
            ),
            owned=Gauge(
                "rgpu_discovery_owned_servers",
                "Servers this replica probes (its share of the hash ring).",
                registry=registry,
            ),
            stale=Gauge(
                "rgpu_discovery_stale_states",
                "Probe states of listed servers not rewritten for two heartbeats: their "
                "prober stopped probing or cannot write.",
                registry=registry,
            ),
        )
        instruments._preset()
        return instruments

    def probed(self, server: ServerName, outcome: ProbeOutcome) -> None:
        """Count one probe of ``server``, its latency and the connections it opened."""
        self.probes.labels(outcome.result).inc()
        self.probe_seconds.observe(outcome.seconds, trace_exemplar())
        if outcome.connections:
            self.probe_connections.labels(server).inc(outcome.connections)

    def forget(self, servers: Iterable[ServerName]) -> None:
        """Drop the per-server series of ``servers`` (gone from the fleet)."""
        for server in servers:
            self.probe_connections.remove(server)

    def requested(self, outcome: OnDemandOutcome) -> None:
        """Count one on-demand probe request by how it was served."""
        self.on_demand.labels(outcome).inc()

    def _preset(self) -> None:
        # Zero-valued series from the start, so rate() and absence alerts work at once.
        for result in get_args(ProbeResult):
            self.probes.labels(result)
        for outcome in get_args(OnDemandOutcome):
            self.on_demand.labels(outcome)
        for cause in RESTART_CAUSES:
            self.watch_restarts.labels(cause)
        for outcome in _EVENT_OUTCOMES:
            self.events.labels(outcome)
        for reason in WRITE_REASONS:
            for outcome in WRITE_OUTCOMES:
                self.state_writes.labels(reason, outcome)
        for result in VERSION_RESULTS:
            self.version_queries.labels(result)


class _StateCollector(Collector):
    """Fleet and topology sizes, from the latest published snapshots."""

    def __init__(self, fleet: FleetState, topology: TopologyState) -> None:
        self._fleet = fleet
        self._topology = topology

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._fleet.snapshot()
        servers = Tally((_flag(s.ready), _flag(s.reachable)) for s in snapshot.values)
        cards = Tally(_card_states(snapshot.values))
        yield _family(
            "rgpu_discovery_servers",
            "Listed servers by Ready condition and reachability.",
            ("ready", "reachable"),
            servers,
        )
        yield _family(
            "rgpu_discovery_cards",
            "Remote cards by health and busy state.",
            ("healthy", "busy"),
            cards,
        )
        yield _gauge(
            "rgpu_discovery_client_nodes",
            "Client nodes in the topology.",
            len(self._topology.snapshot()),
        )
        yield _gauge(
            "rgpu_discovery_fleet_revision", "Revision of the published fleet.", snapshot.revision
        )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


def _counter(registry: CollectorRegistry, name: str, doc: str, *labels: str) -> Counter:
    return Counter(f"rgpu_discovery_{name}", doc, labels, registry=registry)


def _card_states(servers: Iterable[Server]) -> Iterator[tuple[str, str]]:
    for server in servers:
        for card in server.cards:
            yield _flag(card.healthy), _flag(card.uuid in server.busy)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _family(
    name: str, doc: str, labels: tuple[str, str], counts: Tally[tuple[str, str]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for first in ("true", "false"):
        for second in ("true", "false"):
            family.add_metric([first, second], counts[(first, second)])
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)
