"""``rgpu soak --trace FILE``: what the scheduler did with every pod, one JSON line per pod.

A slow wake-up has a cause the soak's figures do not show (a backoff still running, a queue
busy with other pods, a refusal just before the server freed); the pod's own history says
which. The wake-up tail of the priority issue was found only with instrumentation like this,
after three stops on a wrong theory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from rich.console import Console

from rgpu_kubesim import PodRecord

__all__ = ["fault_lines", "faults_path", "save_trace", "trace_lines"]


class Window(Protocol):
    """An injected fault's window (``soak_faults.FaultWindow``), as the trace reads it."""

    @property
    def kind(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float | None: ...


Said = Mapping[str, Sequence[tuple[float, str]]]
"""What the Events about each pod said and when (``time.monotonic()``), by pod uid."""


def trace_lines(
    records: Iterable[PodRecord], started: float, said: Said | None = None
) -> Iterator[str]:
    """One JSON object per pod, in the order the scheduler first saw them; times are seconds
    since ``started`` (``time.monotonic()``). The Events ``said`` about a pod go among its
    steps as ``event`` (why a gated pod waits is said only there)."""
    for record in sorted(records, key=lambda r: r.first_seen):
        line = _line(record, started, (said or {}).get(record.uid, ()))
        yield json.dumps(line, separators=(",", ":"))


def faults_path(trace: Path) -> Path:
    """Where the faults of a trace go: beside it (``soak.jsonl`` -> ``soak.faults.jsonl``)."""
    return trace.with_suffix(".faults.jsonl")


def fault_lines(windows: Iterable[Window], started: float) -> Iterator[str]:
    """One JSON object per injected fault, in the order injected; times as in the trace
    (``end`` null: it lasted to the end of the workload)."""
    for window in windows:
        end = None if window.end is None else _since(window.end, started)
        line = {
            "fault": window.kind,
            "target": window.target,
            "start": _since(window.start, started),
            "end": end,
        }
        yield json.dumps(line, separators=(",", ":"))


def save_trace(
    path: Path,
    records: Iterable[PodRecord],
    started: float,
    console: Console,
    said: Said | None = None,
    windows: Iterable[Window] = (),
) -> None:
    """Write ``trace_lines`` to ``path`` and say so. A trace that cannot be written is
    reported, not raised: the soak's verdict, printed after it, is what the run was for."""
    lines = list(trace_lines(records, started, said))
    faults = list(fault_lines(windows, started))
    try:
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        faults_path(path).write_text("".join(f"{line}\n" for line in faults), encoding="utf-8")
    except OSError as exc:
        # Never wrapped: a path broken across lines cannot be pasted.
        console.print(f"[red]trace not written[/] to {path}: {exc}", soft_wrap=True)
        return
    console.print(f"trace: {len(lines)} pods' scheduling histories in {path}", soft_wrap=True)
    where = faults_path(path)
    console.print(f"faults: {len(faults)} injected, when and where, in {where}", soft_wrap=True)


def _line(
    record: PodRecord, started: float, said: Sequence[tuple[float, str]]
) -> dict[str, object]:
    steps = [(s.at, s.what, s.detail) for s in record.steps]
    steps.extend((at, "event", text) for at, text in said)
    steps.sort(key=lambda step: step[0])
    return {
        "pod": record.key,
        "uid": record.uid,
        "seen": _since(record.first_seen, started),
        "bound": None if record.bound_at is None else _since(record.bound_at, started),
        "node": record.node,
        "attempts": record.attempts,
        "steps": [[_since(at, started), what, detail] for at, what, detail in steps],
    }


def _since(at: float, started: float) -> float:
    return round(at - started, 3)
