"""``rgpu soak --trace``: the file's lines, and a trace that cannot be written never costs the
soak its verdict (the whole run is exercised by the CI soak in tests/test_soak.py)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rgpu_cli.main import app
from rgpu_kubesim import AddressUnavailable, PodRecord, Step
from rgpu_sim import soak_command
from rgpu_sim.soak_faults import FaultWindow
from rgpu_sim.soak_trace import fault_lines, faults_path, save_trace, trace_lines
from rgpu_testkit import flat


def record(name: str, seen: float, *steps: Step, bound: float | None = None) -> PodRecord:
    return PodRecord(
        uid=f"uid-{name}",
        key=f"default/{name}",
        first_seen=seen,
        attempts=sum(1 for s in steps if s.what == "attempt"),
        bound_at=bound,
        node=None if bound is None else "client-01",
        steps=steps,
    )


def test_each_pod_is_one_line_in_the_order_seen_with_times_since_the_start() -> None:
    late = record("late", 105.0, Step(at=105.0, what="queued"))
    early = record(
        "early",
        101.0,
        Step(at=101.0, what="queued"),
        Step(at=101.5, what="attempt"),
        Step(at=101.6, what="refused", detail="0/3 nodes are available"),
        Step(at=103.25, what="moved", detail="assigned pod deleted or finished"),
        Step(at=103.5, what="attempt"),
        Step(at=103.6, what="bound", detail="client-01"),
        bound=103.6,
    )
    lines = [json.loads(line) for line in trace_lines([late, early], started=100.0)]
    assert [line["pod"] for line in lines] == ["default/early", "default/late"]
    assert lines[0] == {
        "pod": "default/early",
        "uid": "uid-early",
        "seen": 1.0,
        "bound": 3.6,
        "node": "client-01",
        "attempts": 2,
        "steps": [
            [1.0, "queued", ""],
            [1.5, "attempt", ""],
            [1.6, "refused", "0/3 nodes are available"],
            [3.25, "moved", "assigned pod deleted or finished"],
            [3.5, "attempt", ""],
            [3.6, "bound", "client-01"],
        ],
    }
    assert (lines[1]["bound"], lines[1]["node"], lines[1]["attempts"]) == (None, None, 0)


def test_what_the_events_said_about_a_pod_goes_among_its_steps_in_time_order() -> None:
    pod = record("gated", 101.0, Step(at=101.0, what="gated"), Step(at=104.0, what="queued"))
    said = {
        "uid-gated": [
            (102.0, "RemoteGPUWaiting: server gpu-01 is being freed for this pod"),
            (103.5, "RemoteGPUWaiting: namespace ml is at its quota"),
        ],
        "uid-other": [(102.5, "Preempted: by default/urgent")],
    }
    [line] = [json.loads(text) for text in trace_lines([pod], started=100.0, said=said)]
    assert line["steps"] == [
        [1.0, "gated", ""],
        [2.0, "event", "RemoteGPUWaiting: server gpu-01 is being freed for this pod"],
        [3.5, "event", "RemoteGPUWaiting: namespace ml is at its quota"],
        [4.0, "queued", ""],
    ]


def test_the_faults_go_beside_the_trace_in_the_order_injected(tmp_path: Path) -> None:
    windows = [
        FaultWindow(kind="lupine-busy", target="gpu-01", start=102.0, end=119.25),
        FaultWindow(kind="apiserver-429", target="*", start=100.5),
    ]
    trace, out = tmp_path / "soak.jsonl", io.StringIO()
    save_trace(trace, [record("a", 101.0)], 100.0, Console(file=out, width=200), None, windows)
    lines = [json.loads(line) for line in faults_path(trace).read_text().splitlines()]
    assert lines == [
        {"fault": "lupine-busy", "target": "gpu-01", "start": 2.0, "end": 19.25},
        {"fault": "apiserver-429", "target": "*", "start": 0.5, "end": None},
    ]
    assert (
        f"faults: 2 injected, when and where, in {tmp_path / 'soak.faults.jsonl'}" in out.getvalue()
    )
    assert [line["fault"] for line in map(json.loads, fault_lines(windows, 100.0))] == [
        "lupine-busy",
        "apiserver-429",
    ]


def test_a_trace_that_cannot_be_written_is_reported_not_raised(tmp_path: Path) -> None:
    out = io.StringIO()
    save_trace(tmp_path, [record("a", 1.0)], 0.0, Console(file=out, width=200))  # a directory
    assert "trace not written" in flat(out.getvalue())
    assert str(tmp_path) in out.getvalue()


def test_a_trace_in_a_missing_directory_is_refused_before_the_soak_starts(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-dir" / "trace.jsonl"
    result = CliRunner().invoke(app, ["soak", "--trace", str(missing)])
    assert result.exit_code == 2
    # Rich wraps the error box at the terminal's width, so the path's length decides where.
    assert "is not a directory" in flat(result.output)


def test_a_fleet_address_taken_by_another_run_of_the_seed_is_said_in_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fake server healed from "down" listens again on its seeded address; a second soak of
    # the same seed may hold it by then. That is a clash of runs, not a crash of rgpu.
    async def clash(*_: object) -> None:
        taken = AddressUnavailable("fake lupine gpu-04 cannot listen on 127.63.166.94:14833")
        raise ExceptionGroup("soak", [taken])

    monkeypatch.setattr(soak_command, "_soak", clash)
    monkeypatch.setattr(soak_command, "die_with_parent", lambda _signal: None)
    level = logging.getLogger("rgpu_runtime").level
    try:
        result = CliRunner().invoke(app, ["soak", "--pods", "20", "--seed", "77"])
    finally:
        logging.getLogger("rgpu_runtime").setLevel(level)
    assert result.exit_code == 2
    said = flat(result.output)
    assert "cannot listen on 127.63.166.94:14833" in said
    assert "is another run of seed 77 using them? Give one of them another --seed." in said
    assert "Traceback" not in result.output
