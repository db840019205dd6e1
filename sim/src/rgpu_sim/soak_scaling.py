"""Replicas must divide the work, not repeat it (docs/design.md §12). These checks judge that from
what rgpu does not report about itself: connections counted at the fake lupine servers (each server
probed once per interval, whatever the number of discovery replicas), every discovery replica's
``/v1/fleet`` sampled side by side (one fleet, one revision sequence), every metrics replica scraped
side by side (each card series once in total), and the simulated apiserver's request meter by client
(the allocator's background writes, flat in its replica count).

Sampling runs while the soak runs; the probe and write windows run once the workload is
drained, when nothing but background work is left. Each check is a pure function of its
evidence, so unit tests feed it the failure it exists to catch.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from anyio.abc import TaskStatus

from rgpu_contracts import Claim, ClaimState, ContainerAssignment, Fleet, PodRef, PodUID
from rgpu_kubesim import SimApiServer
from rgpu_runtime.replicas import MembershipTiming

from .checks import CheckResult
from .soak_evidence import ANNOTATION_CLAIMS, ANNOTATION_SERVER
from .stack import Stack

__all__ = [
    "CARD_FAMILIES",
    "FleetSample",
    "ScalingEvidence",
    "SeriesSample",
    "WriteWindow",
    "card_series",
    "check_background_writes",
    "check_identical_fleets",
    "check_probes_per_interval",
    "check_single_series",
    "fleet_digest",
    "measure_after_drain",
    "replica_urls",
    "sample_replicas",
    "scaling_checks",
]

CARD_FAMILIES = frozenset(
    {
        "hami_remote_gpu_memory_limit_bytes",
        "hami_remote_gpu_allocated",
        "hami_remote_gpu_overview",
        "rgpu_card_state",
        "rgpu_card_holder_info",
        "rgpu_server_up",
        "rgpu_server_cards",
    }
)
"""The families the metrics service renders per card or server (the rest are self-metrics)."""
PROBE_TOLERANCE = 0.25
"""Probes per server per interval may stray this far from 1: on-demand probes add a few, and
a window's ends cut intervals."""
WRITES_PER_STALE_CLAIM = 1.25
"""A stale claim costs one Lease write; above this, more than one replica swept it."""
SETTLE_ROUNDS = 3
"""Rounds at the end of which one must find the replicas agreeing (a round may straddle a
change or a handover)."""
SAMPLE_SECONDS = 2.0
"""How often the discovery and metrics replicas are sampled during the soak."""
BACKGROUND_VERBS = frozenset({"create", "update", "patch", "delete"})


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSample:
    """What one discovery replica served in one sampling round."""

    round: int
    replica: str
    revision: int
    digest: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesSample:
    """The card series one metrics replica served in one sampling round."""

    round: int
    replica: str
    series: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteWindow:
    """The allocator's apiserver writes in two equal windows after the drain: one at rest
    (election renewals only), one while it sweeps ``planted`` stale claims."""

    seconds: float
    at_rest: int
    sweeping: int
    planted: int
    swept: int


@dataclass(slots=True)
class ScalingEvidence:
    """Everything the scaling checks judge; filled while the soak runs and after it."""

    replicas: int = 1
    fleets: list[FleetSample] = field(default_factory=list)
    series: list[SeriesSample] = field(default_factory=list)
    probes: dict[str, int] = field(default_factory=dict)
    probe_window_seconds: float = 0.0
    probe_interval_seconds: float = 1.0
    writes: WriteWindow | None = None


def fleet_digest(raw: Mapping[str, Any]) -> str:
    """A fingerprint of a fleet's content: its revision and ``observedAt`` (when this replica
    built it, a fact about the replica, not the fleet) left out."""
    content = {k: v for k, v in raw.items() if k not in ("revision", "observedAt")}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def card_series(text: str) -> frozenset[str]:
    """The card-family sample lines (name and labels) of a Prometheus text scrape."""
    found = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in CARD_FAMILIES:
                found.add(line.rsplit(" ", 1)[0])
    return frozenset(found)


def check_probes_per_interval(
    probes: Mapping[str, int], window: float, interval: float, replicas: int
) -> CheckResult:
    """Each server was probed once per interval in total (connections at the server)."""
    intervals = window / interval if interval > 0 else 0.0
    rates = {s: n / intervals for s, n in probes.items()} if intervals else {}
    figures = (
        f"min {min(rates.values()):.2f}, median {statistics.median(rates.values()):.2f}, "
        f"max {max(rates.values()):.2f} over {len(rates)} servers"
        if rates
        else "no servers"
    )
    off = sorted(s for s, r in rates.items() if abs(r - 1.0) > PROBE_TOLERANCE)
    return CheckResult(
        name=f"each server probed once per interval by {replicas} discovery replicas "
        f"(probes per server per interval: {figures})",
        passed=bool(rates) and not off,
        detail="; ".join(f"{s}: {rates[s]:.2f}" for s in off[:5]) or "nothing measured",
    )


def check_identical_fleets(samples: Sequence[FleetSample]) -> CheckResult:
    """Every discovery replica served one fleet: a revision always means the same content, and
    in one of the last ``SETTLE_ROUNDS`` rounds every replica served the same revision and
    content (one round may straddle a change)."""
    by_revision: dict[int, set[str]] = defaultdict(set)
    rounds: dict[int, set[tuple[int, str]]] = defaultdict(set)
    for sample in samples:
        by_revision[sample.revision].add(sample.digest)
        rounds[sample.round].add((sample.revision, sample.digest))
    split = sorted(r for r, digests in by_revision.items() if len(digests) > 1)
    last = [rounds[n] for n in sorted(rounds)[-SETTLE_ROUNDS:]]
    problems = [f"revision {r} had {len(by_revision[r])} different contents" for r in split[:3]]
    if last and all(len(fleets) > 1 for fleets in last):
        problems.append(
            f"the last {len(last)} rounds each saw different fleets: {sorted(last[-1])[:3]}"
        )
    return CheckResult(
        name=f"every discovery replica served the same fleet ({len(rounds)} rounds, "
        f"{len(by_revision)} revisions, {len(split)} split)",
        passed=bool(samples) and not problems,
        detail="; ".join(problems) or "nothing sampled",
    )


def check_single_series(samples: Sequence[SeriesSample]) -> CheckResult:
    """Each card series reached the scraper once in total: in no round did two metrics
    replicas serve the same series, and one of the last ``SETTLE_ROUNDS`` rounds had exactly
    one exporting replica."""
    rounds: dict[int, list[SeriesSample]] = defaultdict(list)
    for sample in samples:
        rounds[sample.round].append(sample)
    doubled = []
    for number, found in sorted(rounds.items()):
        seen: dict[str, str] = {}
        for sample in found:
            for series in sample.series:
                first = seen.setdefault(series, sample.replica)
                if first != sample.replica:
                    doubled.append(f"round {number}: {series} from {first} and {sample.replica}")
    exporters = [
        sorted(s.replica for s in rounds[n] if s.series) for n in sorted(rounds)[-SETTLE_ROUNDS:]
    ]
    problems = doubled[:3]
    if exporters and all(len(found) != 1 for found in exporters):
        problems.append(
            f"none of the last {len(exporters)} rounds had one exporting replica: {exporters[-1]}"
        )
    return CheckResult(
        name=f"no card series served by two metrics replicas ({len(rounds)} rounds, "
        f"{len(doubled)} duplicates)",
        passed=bool(samples) and not problems,
        detail="; ".join(problems),
    )


def check_background_writes(window: WriteWindow | None, replicas: int) -> CheckResult:
    """The allocator's background writes did not grow with its replicas: each stale claim
    cost one Lease write (a replica sweeping beside the leader would add its own, refused
    or not), and all of them were swept."""
    if window is None or window.seconds <= 0:
        return CheckResult(
            name="allocator background writes measured", passed=False, detail="no write window"
        )
    rest = window.at_rest / window.seconds
    extra = max(0, window.sweeping - window.at_rest)
    per_claim = extra / window.planted if window.planted else 0.0
    name = (
        f"allocator background writes flat in its {replicas} replicas ({rest:.2f}/s at rest, "
        f"{per_claim:.2f} per stale claim, {window.swept}/{window.planted} swept)"
    )
    problems = []
    if per_claim > WRITES_PER_STALE_CLAIM:
        problems.append(f"{extra} writes for {window.planted} stale claims")
    if window.swept < window.planted:
        problems.append(f"{window.planted - window.swept} stale claims never swept")
    return CheckResult(name=name, passed=not problems, detail="; ".join(problems))


# --- sampling while the soak runs -----------------------------------------------------------


async def sample_replicas(
    http: httpx.AsyncClient,
    discovery: Mapping[str, str],
    metrics: Mapping[str, str],
    evidence: ScalingEvidence,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Every ``SAMPLE_SECONDS``, read each discovery replica's fleet and scrape each metrics
    replica (by name → URL) until cancelled; a replica that does not answer is left out."""
    task_status.started()
    number = 0
    while True:
        await sample_round(http, discovery, metrics, evidence, number)
        number += 1
        await anyio.sleep(SAMPLE_SECONDS)


async def sample_round(
    http: httpx.AsyncClient,
    discovery: Mapping[str, str],
    metrics: Mapping[str, str],
    evidence: ScalingEvidence,
    number: int,
) -> None:
    """One round of ``sample_replicas``."""
    for name, url in discovery.items():
        raw = await _get_json(http, f"{url}/v1/fleet")
        if raw is not None:
            evidence.fleets.append(
                FleetSample(
                    round=number,
                    replica=name,
                    revision=int(raw.get("revision", -1)),
                    digest=fleet_digest(raw),
                )
            )
    for name, url in metrics.items():
        text = await _get_text(http, f"{url}/metrics")
        if text is not None:
            evidence.series.append(
                SeriesSample(round=number, replica=name, series=card_series(text))
            )


async def _get_json(http: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    text = await _get_text(http, url)
    try:
        found = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


async def _get_text(http: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await http.get(url, timeout=5)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


# --- windows after the drain ----------------------------------------------------------------

_MEMBERSHIP = MembershipTiming()
_RING_SETTLE_SECONDS = _MEMBERSHIP.lease_seconds + 2 * _MEMBERSHIP.renew_seconds


async def count_probes(
    connections: Mapping[str, Any], seconds: float
) -> tuple[dict[str, int], float]:
    """Connections each server accepted over ``seconds`` (``connections``: server name →
    an object with a ``connections`` count); returns them and the real window length."""
    before = {name: int(lupine.connections) for name, lupine in connections.items()}
    started = time.monotonic()
    await anyio.sleep(seconds)
    after = {name: int(lupine.connections) for name, lupine in connections.items()}
    return {n: after[n] - before[n] for n in before}, time.monotonic() - started


def allocator_writes(sim: SimApiServer) -> int:
    """Writes the allocator has sent so far (refused ones too), by the apiserver's meter."""
    return sum(
        count.requests
        for key, count in sim.meter.snapshot().items()
        if key.client == "rgpu-allocator" and key.verb in BACKGROUND_VERBS
    )


async def measure_writes(
    sim: SimApiServer, fleet: Fleet, namespace: str, seconds: float
) -> WriteWindow:
    """Count the allocator's writes over ``seconds`` at rest, then plant one stale booking
    (of a pod that never existed, booked long ago, as a crashed replica leaves it) in every
    server's claim Lease and count its writes over as long again, while it sweeps them."""
    start = allocator_writes(sim)
    await anyio.sleep(seconds)
    rest = allocator_writes(sim)
    planted = _plant(sim, fleet, namespace)
    await anyio.sleep(seconds)
    swept = sum(1 for server in planted if not _still_planted(sim, namespace, server))
    return WriteWindow(
        seconds=seconds,
        at_rest=rest - start,
        sweeping=allocator_writes(sim) - rest,
        planted=len(planted),
        swept=swept,
    )


STALE_UID = "rgpu-soak-stale-"


def _claim_leases(sim: SimApiServer, namespace: str) -> dict[str, dict[str, Any]]:
    leases = {}
    for lease in sim.store.list("leases", namespace=namespace):
        server = ((lease.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SERVER)
        if server:
            leases[str(server)] = lease
    return leases


def _plant(sim: SimApiServer, fleet: Fleet, namespace: str) -> list[str]:
    planted: list[str] = []
    leases = _claim_leases(sim, namespace)
    for server in fleet.servers:
        lease = leases.get(server.name)
        cards = tuple(card.id for card in server.cards)
        if lease is None or not cards:
            continue
        stale = Claim(
            pod=PodRef(uid=PodUID(STALE_UID + server.name), namespace="default", name="stale"),
            server=server.name,
            cards=cards,
            containers=(ContainerAssignment(name="main", cards=cards),),
            state=ClaimState.BOOKED,
            booked_at=time.time() - 3600.0,
        )
        annotations = lease["metadata"].setdefault("annotations", {})
        claims = json.loads(annotations.get(ANNOTATION_CLAIMS) or "[]")
        annotations[ANNOTATION_CLAIMS] = json.dumps([*claims, stale.to_dict()])
        sim.store.replace("leases", lease, namespace=namespace)
        planted.append(server.name)
    return planted


def _still_planted(sim: SimApiServer, namespace: str, server: str) -> bool:
    lease = _claim_leases(sim, namespace).get(server)
    text = ((lease or {}).get("metadata") or {}).get("annotations", {}).get(ANNOTATION_CLAIMS)
    return lease is not None and STALE_UID in (text or "")


def scaling_checks(evidence: ScalingEvidence) -> tuple[CheckResult, ...]:
    """The four checks, in the order the report prints them."""
    return (
        check_probes_per_interval(
            evidence.probes,
            evidence.probe_window_seconds,
            evidence.probe_interval_seconds,
            evidence.replicas,
        ),
        check_identical_fleets(evidence.fleets),
        check_single_series(evidence.series),
        check_background_writes(evidence.writes, evidence.replicas),
    )


def replica_urls(stack: Stack, service: str) -> dict[str, str]:
    """Each replica of ``service`` by name, with its own URL (not its Service's)."""
    return {name: p.url for name, p in stack.services.items() if p.service == service}


async def measure_after_drain(stack: Stack, evidence: ScalingEvidence, namespace: str) -> None:
    """The probe and write windows, once the workload is gone and the faults healed."""
    interval = stack.options.probe_interval_seconds
    lupines = {name: stack.fleet.lupine.by_name(name) for name in stack.fleet.endpoints()}
    if stack.options.replicas > 1:
        # A replica killed just before the drain came back under a new identity; its old
        # membership Lease owns part of the ring until the others judge it dead (the lease
        # time, then a renewal), and those servers wait for that. Count once rings agree.
        await anyio.sleep(_RING_SETTLE_SECONDS)
    evidence.probes, evidence.probe_window_seconds = await count_probes(
        lupines, min(30.0, max(5.0, 10 * interval))
    )
    evidence.probe_interval_seconds = interval
    raw = await _get_json(stack.apiserver, f"{stack.url('discovery')}/v1/fleet")
    if raw is not None:
        seconds = max(5.0, stack.options.booking_ttl_seconds / 2 + 1.0)
        evidence.writes = await measure_writes(stack.sim, Fleet.from_dict(raw), namespace, seconds)
