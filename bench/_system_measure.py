"""What the system benchmark reads off a running stack without touching the services: CPU and
peak memory of each process from /proc, the apiserver's request tally between two moments,
percentiles, and py-spy profiles summarised into the frames that cost the most.

py-spy is not a project dependency: ``--profile`` needs it installed in the environment
(``python3 -m uv pip install py-spy``) and permission to trace the services (root, or
``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from rgpu_kubesim import RequestCount, RequestKey

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcSample:
    """One process at one moment: CPU seconds used so far and its peak resident set."""

    cpu_seconds: float
    peak_rss_mib: float
    at: float


def sample(pid: int) -> ProcSample:
    """CPU (user + system) and VmHWM of ``pid`` now."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return ProcSample(cpu_seconds=cpu, peak_rss_mib=peak, at=time.monotonic())


def samples(pids: Mapping[str, int]) -> dict[str, ProcSample]:
    return {name: sample(pid) for name, pid in pids.items()}


def cpu_between(
    before: Mapping[str, ProcSample], after: Mapping[str, ProcSample]
) -> dict[str, float]:
    """CPU seconds each process used between two ``samples``."""
    return {name: after[name].cpu_seconds - before[name].cpu_seconds for name in after}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def percentile(values: Sequence[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


Tally = Mapping[RequestKey, RequestCount]


def tally_between(before: Tally, after: Tally) -> dict[RequestKey, RequestCount]:
    """Requests and bytes added between two ``RequestMeter.snapshot()`` calls."""
    grown = {}
    for key, count in after.items():
        old = before.get(key, RequestCount())
        if count.requests > old.requests or count.bytes > old.bytes:
            grown[key] = RequestCount(
                requests=count.requests - old.requests, bytes=count.bytes - old.bytes
            )
    return grown


def by_verb(tally: Tally, clients: Iterable[str]) -> Counter[str]:
    """Requests of ``clients`` by ``verb resource``."""
    wanted = set(clients)
    counts: Counter[str] = Counter()
    for key, count in tally.items():
        if key.client in wanted:
            counts[f"{key.verb} {key.resource}"] += count.requests
    return counts


def bytes_of(tally: Tally, clients: Iterable[str], verb: str, resource: str) -> int:
    wanted = set(clients)
    return sum(
        c.bytes
        for k, c in tally.items()
        if k.client in wanted and k.verb == verb and k.resource == resource
    )


# -- profiles ----------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Profiler:
    """py-spy ``record`` attached to each process until ``stop``; raw (collapsed) stacks."""

    out_dir: Path
    phase: str
    running: dict[str, tuple[subprocess.Popen[bytes], Path]]

    @classmethod
    def start(cls, pids: Mapping[str, int], out_dir: Path, phase: str) -> Profiler:
        spy = shutil.which("py-spy")
        if spy is None:
            raise SystemExit("--profile needs py-spy: python3 -m uv pip install py-spy")
        out_dir.mkdir(parents=True, exist_ok=True)
        running = {}
        for name, pid in pids.items():
            path = out_dir / f"{phase}-{name}.txt"
            args = [spy, "record", "--pid", str(pid), "--rate", "50", "--format", "raw"]
            args += ["--nonblocking", "--output", str(path)]
            log = (out_dir / f"{phase}-{name}.log").open("wb")
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            running[name] = (process, path)
        return cls(out_dir=out_dir, phase=phase, running=running)

    def stop(self) -> dict[str, Path]:
        """Stop every recorder (py-spy writes its output on SIGINT); the files written."""
        for process, _ in self.running.values():
            process.send_signal(signal.SIGINT)
        written = {}
        for name, (process, path) in self.running.items():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            if path.exists():
                written[name] = path
        return written


def _stacks(path: Path) -> Counter[tuple[str, ...]]:
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks[tuple(frames.split(";"))] += int(count)
    return stacks


def _where(frame: str) -> tuple[str, str]:
    """("function", "package/module.py") of a py-spy frame ``function (package/module.py:12)``."""
    name, _, where = frame.partition(" (")
    return name, where.rsplit(":", 1)[0]


_LOOP = "event loop in C (uvloop: sockets, callbacks)"
"""py-spy sees no Python frame inside uvloop, so its own work shows on the frame that started
the loop (``Runner.run`` in asyncio, ``run_service`` in our code)."""


def _package(frame: str) -> str:
    name, path = _where(frame)
    if name == "Runner.run":
        return _LOOP
    return path.split("/", 1)[0] if "/" in path else path


def _ours(frame: str) -> str | None:
    name, path = _where(frame)
    if name == "run_service":
        return _LOOP
    return f"{name} ({path})" if path.startswith("rgpu_") else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSummary:
    """Where one process's sampled (non-idle) time went."""

    samples: int
    by_package: list[tuple[str, float]]
    """Share of samples by the package of the innermost frame (its own time)."""
    by_our_frame: list[tuple[str, float]]
    """Share of samples by the innermost frame of rgpu's code on the stack (inclusive of the
    libraries it called): which of our functions the time is spent for."""


def summarise(path: Path, top: int = 8) -> ProfileSummary:
    stacks = _stacks(path)
    total = sum(stacks.values()) or 1
    packages: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    for frames, count in stacks.items():
        if not frames:
            continue
        packages[_package(frames[-1])] += count
        innermost = next((o for o in map(_ours, reversed(frames)) if o), "(outside rgpu code)")
        ours[innermost] += count
    return ProfileSummary(
        samples=total,
        by_package=[(k, 100 * v / total) for k, v in packages.most_common(top)],
        by_our_frame=[(k, 100 * v / total) for k, v in ours.most_common(top)],
    )


def histogram_buckets(text: str, name: str, **labels: str) -> dict[float, float]:
    """Cumulative bucket counts (``le`` -> count) of histogram ``name`` in exposition
    ``text``, summed over the series matching ``labels``."""
    found: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != f"{name}_bucket":
                continue
            if any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            le = float(sample.labels["le"])
            found[le] = found.get(le, 0.0) + sample.value
    return found


def bucket_quantile(before: Mapping[float, float], after: Mapping[float, float], q: float) -> float:
    """The ``q`` quantile (0..1) of what was observed between two bucket readings, linearly
    interpolated inside its bucket as Prometheus' histogram_quantile does; NaN when empty."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            share = (rank - below) / (count - below) if count > below else 0.0
            return lower + (bound - lower) * share
        lower, below = bound, count
    return lower
