"""The system benchmark's figures, computed from what the phases measured and printed beside
the targets of issue 15, one block per granularity."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _system_measure as m

from rgpu_sim.stack import SERVICES, Stack

RATE_TARGET = 100.0
FILTER_P50_MS, FILTER_P99_MS = 2.5, 10.0
CPU_PER_POD_MS = 10.0
"""Issue 26: rgpu's four services together, and the simulation, each <= 10 ms per pod."""
CYCLES_PER_POD = 1.1
FREED_P99_S = 2.0
DISCOVERY_REST_SHARE = 0.05
RSS_TARGET_MIB = 300.0
WATCH_ADVANTAGE = 100.0
EMULATOR_CYCLE_MS = 10.0
"""kube-scheduler schedules >= 100 pods/s, so the emulator's own work must stay under 10 ms."""
RGPU_CLIENTS = tuple(f"rgpu-{s}" for s in SERVICES)
REFRESH_SECONDS = 15.0
"""HAMi's periodic full pod list."""


@dataclass(slots=True, kw_only=True)
class Phase:
    """What one phase measured."""

    pods: list[str] = field(default_factory=list)
    """uids created in this phase."""
    started: float = 0.0
    ended: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    tally: dict[Any, Any] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    load: str = ""
    freed: dict[str, float] = field(default_factory=dict)
    """uid of a deleted holder -> when its deletion was acknowledged."""
    filter_inside_ms: tuple[float, float] = (float("nan"), float("nan"))
    """``/filter`` p50, p99 as the extender itself timed it (its histogram, interpolated)."""

    @property
    def seconds(self) -> float:
        return max(self.ended - self.started, 1e-9)


def _bound(stack: Stack, uids: Sequence[str]) -> list[float]:
    records = stack.scheduler.records
    return sorted(r.bound_at for u in uids if (r := records.get(u)) and r.bound_at is not None)


def freed_to_bound(stack: Stack, uids: Sequence[str], freed: Mapping[str, float]) -> list[float]:
    """For each freed server (a holder deleted while pods waited): the time until a waiting pod
    was bound to it, or the first of them in card granularity: how long freed room sat idle.

    The room is free when the holder's containers have stopped (the kubelet's end of its graceful
    deletion, 10 % of its 30 s grace here), not when the deletion was asked: until then the holder
    still runs on the server and keeps it (docs/design.md#terminating-pods-keep-their-server)."""
    runs, records = stack.kubelet.records, stack.scheduler.records
    binds: dict[str, list[float]] = {}
    for uid in uids:
        record, ran = records.get(uid), runs.get(uid)
        if record is not None and ran is not None and record.bound_at is not None:
            binds.setdefault(ran.endpoint, []).append(record.bound_at)
    waits = []
    for uid, asked in freed.items():
        at = max(asked, runs[uid].finished_at or asked)
        later = [b for b in binds.get(runs[uid].endpoint, ()) if b >= at]
        if later:
            waits.append(min(later) - at)
    return waits


def _unbound_why(stack: Stack, uids: Sequence[str]) -> dict[str, int]:
    """What the scheduler last heard for each pod left unbound (refusal or error text)."""
    why: Counter[str] = Counter()
    for uid in uids:
        record = stack.scheduler.records.get(uid)
        if record is None:
            why["never seen by the scheduler"] += 1
        elif record.bound_at is None:
            kind = "refused" if record.refusals else "error" if record.errors else "not tried"
            why[f"{kind} (attempts {min(record.attempts, 3)}+): {record.last_message[:90]}"] += 1
    return dict(why.most_common(5))


def _cycles(stack: Stack, uids: Sequence[str]) -> dict[str, float]:
    """Scheduling attempts per bound pod, and how many bound pods were admitted (held behind
    rgpu's gate until booked) before their first attempt."""
    bound = [r for u in uids if (r := stack.scheduler.records.get(u)) and r.bound_at is not None]
    attempts = sum(r.attempts for r in bound)
    gated = sum(1 for r in bound if r.gated_seconds > 0)
    return {"per_pod": attempts / max(len(bound), 1), "admitted_first": gated, "bound": len(bound)}


def figures(
    stack: Stack,
    pids: Mapping[str, int],
    phases: tuple[Phase, Phase, Phase],
    baseline: Mapping[str, float],
    *,
    admission: str = "gate",
) -> dict[str, Any]:
    """Every printed figure of one granularity, as plain values (also written as JSON)."""
    rest, b, s = phases
    bound_b, bound_s = _bound(stack, b.pods), _bound(stack, s.pods)
    scheduled = max(len(bound_b) + len(bound_s), 1)
    both = {k: b.latencies.get(k, []) + s.latencies.get(k, []) for k in b.latencies}
    own = sum(both["cycle"]) - sum(both["filter"]) - sum(both["prioritize"])
    watch = m.bytes_of(s.tally, RGPU_CLIENTS, "watch", "pods") * REFRESH_SECONDS / s.seconds
    watchers = {c: m.bytes_of(s.tally, (c,), "watch", "pods") for c in RGPU_CLIENTS}
    cpu_per_byte = (baseline["apiserver_cpu"] + baseline["decode"]) / max(baseline["bytes"], 1)
    requests = m.by_verb(b.tally, RGPU_CLIENTS) + m.by_verb(s.tally, RGPU_CLIENTS)
    last = bound_b[-1] if bound_b else b.ended
    return {
        "admission": admission,
        "cycles": _cycles(stack, [*b.pods, *s.pods]),
        "burst_filter_inside_ms": list(b.filter_inside_ms),
        "burst": {"pods": len(b.pods), "bound": len(bound_b)},
        "unbound_why": _unbound_why(stack, [*b.pods, *s.pods]),
        "burst_rate": len(bound_b) / max(last - b.started, 1e-9),
        "stream": {"pods": len(s.pods), "bound": len(bound_s), "freed": len(s.freed)},
        "latency_ms": {k: [1000 * x for x in v] for k, v in both.items()},
        "burst_filter_ms": [1000 * x for x in b.latencies.get("filter", [])],
        "freed_to_bound_s": freed_to_bound(stack, s.pods, s.freed),
        "cpu_ms_per_pod": {n: 1000 * (b.cpu[n] + s.cpu[n]) / scheduled for n in b.cpu},
        "peak_rss_mib": {n: m.sample(pid).peak_rss_mib for n, pid in pids.items()},
        "rest_share": {n: c / rest.seconds for n, c in rest.cpu.items()},
        "requests_per_pod": {k: v / scheduled for k, v in requests.most_common()},
        "emulator_own_ms": 1000 * own / max(len(both["cycle"]), 1),
        "emulator_own_ms_per_pod": 1000 * own / scheduled,
        "relist": dict(baseline),
        "watch_bytes_per_refresh": watch,
        "watch_bytes_by_client": watchers,
        "watch_cpu_per_refresh_est": watch * cpu_per_byte,
        "load": {"rest": rest.load, "burst": b.load, "stream": s.load},
    }


def _line(name: str, value: str, target: str = "", ok: bool | None = None) -> None:
    verdict = "" if ok is None else ("ok" if ok else "MISS")
    print(f"  {name:<46} {value:>20}   {target:<24} {verdict}", flush=True)


def _pair(values: Sequence[float], digits: int = 1) -> str:
    return f"{m.percentile(values, 50):.{digits}f} / {m.percentile(values, 99):.{digits}f}"


def show(granularity: str, f: Mapping[str, Any]) -> None:
    """Print one granularity's figures beside the targets."""
    print(f"\n== granularity {granularity}; load average (1/5/15 min) {f['load']}")
    burst, stream = f["burst"], f["stream"]
    _line("burst: pods bound / created", f"{burst['bound']}/{burst['pods']}")
    rate = f["burst_rate"]
    _line("burst: pods bound per second", f"{rate:.1f}", f">= {RATE_TARGET:g}", rate >= RATE_TARGET)
    _line("stream: pods bound / created / holders freed", "{bound}/{pods}/{freed}".format(**stream))
    for why, count in f["unbound_why"].items():
        _line(f"unbound: {count} x", why[:60])
    _show_latencies(f)
    _show_admission(f)
    freed = f["freed_to_bound_s"]
    ok = bool(freed) and m.percentile(freed, 99) <= FREED_P99_S
    label = f"freed -> waiting pod bound s p50/p99 (n={len(freed)})"
    _line(label, _pair(freed, 2) if freed else "n/a", f"p99 <= {FREED_P99_S:g}", ok)
    for name, cpu in f["cpu_ms_per_pod"].items():
        _line(f"CPU ms per scheduled pod: {name}", f"{cpu:.1f}")
    ours = sum(v for n, v in f["cpu_ms_per_pod"].items() if n in SERVICES)
    sim = sum(v for n, v in f["cpu_ms_per_pod"].items() if n not in SERVICES)
    target = f"<= {CPU_PER_POD_MS:g}"
    _line(
        "CPU ms per scheduled pod: rgpu's services", f"{ours:.1f}", target, ours <= CPU_PER_POD_MS
    )
    _line("CPU ms per scheduled pod: the simulation", f"{sim:.1f}", target, sim <= CPU_PER_POD_MS)
    for name, rss in f["peak_rss_mib"].items():
        service = name in SERVICES
        target = f"<= {RSS_TARGET_MIB:g}" if service else ""
        _line(
            f"peak RSS MiB: {name}",
            f"{rss:.0f}",
            target,
            rss <= RSS_TARGET_MIB if service else None,
        )
    for name, share in f["rest_share"].items():
        d = name == "discovery"
        target = f"<= {100 * DISCOVERY_REST_SHARE:g} % of a core" if d else ""
        _line(
            f"at rest, % of a core: {name}",
            f"{100 * share:.1f}",
            target,
            share <= DISCOVERY_REST_SHARE if d else None,
        )
    for what, per_pod in f["requests_per_pod"].items():
        _line(f"apiserver requests per pod: {what}", f"{per_pod:.2f}")
    own = f["emulator_own_ms"]
    _line(
        "scheduler emulator own ms per cycle",
        f"{own:.2f}",
        f"<= {EMULATOR_CYCLE_MS:g}",
        own <= EMULATOR_CYCLE_MS,
    )
    _line("  the same per scheduled pod, ms", f"{f['emulator_own_ms_per_pod']:.2f}")
    _show_baseline(f)


def _show_admission(f: Mapping[str, Any]) -> None:
    cycles = f["cycles"]
    per_pod = cycles["per_pod"]
    _line(
        "scheduler cycles per bound GPU pod",
        f"{per_pod:.2f}",
        f"<= {CYCLES_PER_POD:g}",
        per_pod <= CYCLES_PER_POD,
    )
    gated = f"{cycles['admitted_first']}/{cycles['bound']}"
    _line("bound pods admitted before any /filter", gated)
    p50, p99 = f["burst_filter_inside_ms"]
    ok = p50 <= FILTER_P50_MS and p99 <= FILTER_P99_MS
    target = f"p50 <= {FILTER_P50_MS:g}, p99 <= {FILTER_P99_MS:g}"
    _line("/filter ms inside the extender, burst", f"{p50:.1f} / {p99:.1f}", target, ok)


def _show_latencies(f: Mapping[str, Any]) -> None:
    for verb in ("filter", "prioritize", "bind"):
        values = f["latency_ms"].get(verb, [])
        target, ok = "", None
        _line(f"/{verb} ms p50 / p99 (n={len(values)})", _pair(values), target, ok)
    _line("  /filter ms during the burst only", _pair(f["burst_filter_ms"]))


def _show_baseline(f: Mapping[str, Any]) -> None:
    relist, watch = f["relist"], f["watch_bytes_per_refresh"]
    cpu = relist["apiserver_cpu"] + relist["decode"]
    _line("HAMi relist per 15 s: MB", f"{relist['bytes'] / 1e6:.1f}")
    _line(
        "  CPU s: apiserver + client (receive, decode)",
        f"{relist['apiserver_cpu']:.2f} + {relist['decode']:.2f}",
    )
    _line("rgpu pod watches per 15 s: MB", f"{watch / 1e6:.3f}")
    _line("  CPU s (est. at the relist's CPU per byte)", f"{f['watch_cpu_per_refresh_est']:.4f}")
    for client, size in f["watch_bytes_by_client"].items():
        if size:
            _line(f"  pod watch of {client}, whole stream, MB", f"{size / 1e6:.3f}")
    ratio = relist["bytes"] / watch if watch else float("inf")
    _line(
        "relist / watch: bytes",
        f"{ratio:.0f}x",
        f">= {WATCH_ADVANTAGE:g}x",
        ratio >= WATCH_ADVANTAGE,
    )
    est = cpu / f["watch_cpu_per_refresh_est"] if f["watch_cpu_per_refresh_est"] else float("inf")
    _line(
        "relist / watch: CPU (est.)",
        f"{est:.0f}x",
        f">= {WATCH_ADVANTAGE:g}x",
        est >= WATCH_ADVANTAGE,
    )


def show_profiles(files: Mapping[str, Path]) -> None:
    """Per process: own time by package, and the rgpu functions the time was spent for."""
    for name, path in files.items():
        summary = m.summarise(path)
        print(f"  profile {name}: {summary.samples} samples ({path})")
        packages = ", ".join(f"{k} {v:.0f}%" for k, v in summary.by_package)
        print(f"    own time by package: {packages}")
        for frame, share in summary.by_our_frame:
            print(f"    {share:5.1f}%  {frame}")
