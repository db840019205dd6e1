"""The demo's utilisation figure must come from what the emulated kubelet saw, not from rgpu's
bookkeeping, and must stay readable for a fleet of any size.

A server is *held* while at least one pod runs on it; its utilisation is the held time inside
the workload's window divided by the window. Intervals are merged first, so pods sharing a
server (card granularity) are not counted twice, and clipped to the window, so a pod that
started before it or still runs after it counts only for the time inside. Beyond
``FULL_TABLE_MAX`` servers the summary shows the distribution and the extremes instead of a
row per server.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rich.table import Table

__all__ = [
    "EXTREMES",
    "FULL_TABLE_MAX",
    "Held",
    "held_seconds",
    "utilisation",
    "utilisation_table",
]

FULL_TABLE_MAX = 20
"""Up to this many servers the summary lists every one; more would scroll the verdict away."""

EXTREMES = 5
"""How many of the busiest and of the idlest servers a large fleet's summary lists."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Held:
    """One pod holding ``server`` from ``start`` to ``end`` (``None``: still running)."""

    server: str
    start: float
    end: float | None


def held_seconds(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Seconds inside ``[start, end]`` covered by at least one of ``intervals``."""
    total, reach = 0.0, start
    for low, high in sorted(intervals):
        low, high = max(low, reach), min(high, end)
        if high > low:
            total += high - low
            reach = high
    return total


def utilisation(
    holds: Iterable[Held], servers: Iterable[str], start: float, end: float
) -> dict[str, float]:
    """Each server's held share of ``[start, end]`` (0 to 1), by server name, every server
    listed (idle ones at 0); holds of servers outside ``servers`` are ignored."""
    by_server: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for hold in holds:
        by_server[hold.server].append((hold.start, end if hold.end is None else hold.end))
    wall = end - start
    return {
        name: held_seconds(by_server[name], start, end) / wall if wall > 0 else 0.0
        for name in sorted(servers)
    }


def utilisation_table(shares: Mapping[str, float]) -> Table:
    """Every server when there are few; else min/p50/p90/max, the busiest and the idlest."""
    if len(shares) <= FULL_TABLE_MAX:
        table = Table(title="server utilisation (held time / wall time)")
        table.add_column("server")
        table.add_column("held", justify="right")
        for name, share in shares.items():
            table.add_row(name, _percent(share))
        return table
    return _distribution(shares)


def _distribution(shares: Mapping[str, float]) -> Table:
    values = sorted(shares.values())
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    idle = sum(1 for value in values if value == 0)
    table = Table(
        title=f"server utilisation (held time / wall time), {len(values)} servers",
        show_header=False,
    )
    table.add_row(
        "distribution",
        f"min {_percent(values[0])}, p50 {_percent(statistics.median(values))}, "
        f"p90 {_percent(cuts[8])}, max {_percent(values[-1])}; "
        f"mean {_percent(statistics.fmean(values))}; never held: {idle}",
    )
    busiest = sorted(shares.items(), key=lambda item: (-item[1], item[0]))
    idlest = sorted(shares.items(), key=lambda item: (item[1], item[0]))
    table.add_row(f"busiest {EXTREMES}", _listing(busiest[:EXTREMES]))
    table.add_row(f"idlest {EXTREMES}", _listing(idlest[:EXTREMES]))
    return table


def _listing(items: Iterable[tuple[str, float]]) -> str:
    return ", ".join(f"{name} {_percent(share)}" for name, share in items)


def _percent(share: float) -> str:
    # One decimal: a server held for 2 s of a 90 s run is 2.2 %, not a misleading "0 %" or "2 %".
    return f"{share * 100:.1f} %"
