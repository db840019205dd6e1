from __future__ import annotations

import pytest
from rich.console import Console
from rich.table import Table

from rgpu_sim.utilisation import (
    EXTREMES,
    FULL_TABLE_MAX,
    Held,
    held_seconds,
    utilisation,
    utilisation_table,
)


def _text(table: Table) -> str:
    console = Console(record=True, width=400)
    console.print(table)
    return console.export_text()


def test_overlapping_holds_count_once() -> None:
    assert held_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)], 0.0, 10.0) == 4.0


def test_holds_are_clipped_to_the_window() -> None:
    assert held_seconds([(-5.0, 1.0), (9.0, 20.0)], 0.0, 10.0) == 2.0


def test_a_hold_inside_another_adds_nothing() -> None:
    assert held_seconds([(1.0, 9.0), (2.0, 3.0)], 0.0, 10.0) == 8.0


def test_utilisation_is_held_time_over_wall_time_per_server() -> None:
    holds = [
        Held(server="gpu-01", start=100.0, end=102.5),
        Held(server="gpu-01", start=102.0, end=105.0),  # card granularity: same server at once
        Held(server="gpu-02", start=108.0, end=None),  # still running at the end
        Held(server="gone", start=100.0, end=110.0),  # not in the fleet: ignored
    ]
    shares = utilisation(holds, ["gpu-02", "gpu-01", "gpu-03"], start=100.0, end=110.0)
    assert shares == {"gpu-01": 0.5, "gpu-02": pytest.approx(0.2), "gpu-03": 0.0}


def test_an_empty_window_is_zero_not_a_division_error() -> None:
    assert utilisation([], ["gpu-01"], start=5.0, end=5.0) == {"gpu-01": 0.0}


def test_a_small_fleet_lists_every_server_with_a_decimal() -> None:
    shares = {f"gpu-{i:02d}": i / 1000 for i in range(1, FULL_TABLE_MAX + 1)}
    text = _text(utilisation_table(shares))
    assert all(name in text for name in shares)
    assert "0.1 %" in text  # 1 s of 1000 s is not rounded away to "0 %"
    assert "distribution" not in text


def test_a_large_fleet_shows_the_distribution_and_the_extremes_only() -> None:
    shares = {f"gpu-{i:03d}": i / 200 for i in range(200)}
    text = _text(utilisation_table(shares))
    assert "200 servers" in text
    assert "min 0.0 %, p50 49.8 %, p90 89.5 %, max 99.5 %" in text
    assert "never held: 1" in text
    busiest = ", ".join(f"gpu-{i:03d} {i / 2:.1f} %" for i in range(199, 199 - EXTREMES, -1))
    idlest = ", ".join(f"gpu-{i:03d} {i / 2:.1f} %" for i in range(EXTREMES))
    assert busiest in text
    assert idlest in text
    assert "gpu-100" not in text
    assert len(text.splitlines()) < 12
