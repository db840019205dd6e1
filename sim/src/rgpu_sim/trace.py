"""``rgpu trace <namespace>/<pod>``: a pod's scheduling journey as a waterfall in the terminal,
read from the spans the embedded stack keeps (``spans``), with no trace store to set up.

A pod's story is several traces (kube-scheduler starts each verb's trace afresh) joined by
the pod: every trace in which a span names the pod's uid (``k8s.pod.uid``), and the traces
those spans link to (the creation the webhook recorded). When the name was used by several
pods, the one seen last is shown. Each trace is one *step* (created, admitted, filtered,
prioritized, bound); its spans are drawn as a tree below it, with the offset from the story's
start, the duration, the service, the status and a bar on the story's timeline. The slowest
step is marked.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.text import Text

from .spans import SpanRecord, read_spans

__all__ = ["SPANS_VARIABLE", "Story", "find_story", "render_story", "trace_pod"]

SPANS_VARIABLE = "RGPU_TRACE_FILE"
"""Where ``rgpu trace`` reads spans from when no ``--file`` is given."""

NAMESPACE = "k8s.namespace.name"
POD = "k8s.pod.name"
UID = "k8s.pod.uid"
FIXED = 38
"""Columns of a row besides the span's name and bar: offset, duration, service, status, the
gaps, and two for the slowest step's mark."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Line:
    """One span of the waterfall and how deep it sits in its trace."""

    span: SpanRecord
    depth: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Story:
    """A pod's scheduling, as waterfall lines grouped by trace (one trace per step)."""

    namespace: str
    name: str
    uid: str
    steps: tuple[tuple[Line, ...], ...]
    """Each trace's lines in tree order; traces by their start."""

    @property
    def spans(self) -> tuple[SpanRecord, ...]:
        return tuple(line.span for step in self.steps for line in step)

    @property
    def start_ns(self) -> int:
        return min(span.start_ns for span in self.spans)

    @property
    def end_ns(self) -> int:
        return max(span.end_ns for span in self.spans)

    def slowest(self) -> SpanRecord:
        """The first span of the step that took longest."""
        return max((step[0].span for step in self.steps), key=lambda s: s.end_ns - s.start_ns)


def find_story(spans: Sequence[SpanRecord], namespace: str, name: str) -> Story | None:
    """The story of pod ``namespace/name`` among ``spans``; ``None`` when no span names it."""
    named = [s for s in spans if s.attribute(NAMESPACE) == namespace and s.attribute(POD) == name]
    if not named:
        return None
    with_uid = [s for s in named if s.attribute(UID)]
    uid = max(with_uid, key=lambda s: s.start_ns).attribute(UID) if with_uid else ""
    traces = _traces(spans, named, uid)
    by_trace: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        if span.trace_id in traces:
            by_trace[span.trace_id].append(span)
    steps = sorted((_tree(found) for found in by_trace.values()), key=lambda s: s[0].span.start_ns)
    return Story(namespace=namespace, name=name, uid=uid, steps=tuple(steps))


def _traces(spans: Sequence[SpanRecord], named: Sequence[SpanRecord], uid: str) -> set[str]:
    """The pod's traces: those naming its uid and those they link to (without a uid, the
    traces naming it at all: a pod that was only created)."""
    if not uid:
        return {span.trace_id for span in named}
    own = {span.trace_id for span in spans if span.attribute(UID) == uid}
    linked = {link.trace_id for span in spans if span.trace_id in own for link in span.links}
    return own | linked


def _tree(spans: Iterable[SpanRecord]) -> tuple[Line, ...]:
    """Spans of one trace parent first, siblings by start; orphans (their parent was not
    recorded) count as roots."""
    ordered = sorted(spans, key=lambda s: (s.start_ns, -s.end_ns))
    ids = {span.span_id for span in ordered}
    children: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in ordered:
        children[span.parent_id if span.parent_id in ids else ""].append(span)
    lines: list[Line] = []
    stack = [(root, 0) for root in reversed(children[""])]
    while stack:
        span, depth = stack.pop()
        lines.append(Line(span=span, depth=depth))
        stack.extend((child, depth + 1) for child in reversed(children[span.span_id]))
    return tuple(lines)


def render_story(story: Story, *, width: int, depth: int = 0, unicode: bool = True) -> list[Text]:
    """The waterfall, one ``Text`` per line, fitting ``width`` columns (80 at least).

    ``depth`` > 0 keeps only spans at most that deep (1: the steps alone).
    """
    width = max(width, 80)
    name_width = (width - FIXED) * 3 // 5
    bar_width = width - FIXED - name_width
    start, total = story.start_ns, max(1, story.end_ns - story.start_ns)
    slowest = story.slowest()
    mark = "◀" if unicode else "<"
    lines = [*_header(story, total, mark), _columns(name_width)]
    for step in story.steps:
        lines.append(Text(f"trace {step[0].span.trace_id}", style="dim"))
        for line in step:
            if depth and line.depth >= depth:
                continue
            row = _row(line, start, name_width)
            row.append(" " + _bar(line.span, start, total, bar_width, unicode), style="cyan")
            if line.span is slowest:
                row.append(f" {mark}", style="bold yellow")
            lines.append(row)
    return lines


def _header(story: Story, total: int, mark: str) -> tuple[Text, Text]:
    uid = story.uid or "none seen yet (not filtered)"
    count = sum(len(step) for step in story.steps)
    slowest = story.slowest()
    pod = Text(f"pod {story.namespace}/{story.name}  uid {uid}", style="bold")
    summary = Text(
        f"{len(story.steps)} steps (traces), {count} spans over {_duration(total / 1e9)}; "
        f"slowest step {mark} {slowest.name} {_duration(slowest.seconds)}"
    )
    return pod, summary


def _columns(name_width: int) -> Text:
    return Text(f"{'offset':>8} {'duration':>8} {'service':<10} {'st':<4} span")


def _row(line: Line, start: int, name_width: int) -> Text:
    span = line.span
    offset = f"+{(span.start_ns - start) / 1e9:.3f}s"
    # A provider without a service name reports "unknown_service" (OpenTelemetry's default).
    service = "-" if span.service.startswith("unknown_service") else span.service
    service = service.removeprefix("rgpu-")[:10]
    failed = span.status == "error"
    label = ("  " * line.depth + span.name)[:name_width]
    row = Text(f"{offset:>8} {_duration(span.seconds):>8} {service:<10} ")
    row.append(f"{'ERR' if failed else 'ok':<4}", style="bold red" if failed else "green")
    row.append(f" {label:<{name_width}}", style="bold" if line.depth == 0 else "")
    return row


def _bar(span: SpanRecord, start: int, total: int, width: int, unicode: bool) -> str:
    first = min(width - 1, math.floor((span.start_ns - start) / total * width))
    last = max(first + 1, math.ceil((span.end_ns - start) / total * width))
    fill, empty = ("█", "·") if unicode else ("#", ".")
    return empty * first + fill * (min(last, width) - first) + empty * (width - min(last, width))


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f}s"
    if seconds >= 0.01:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds * 1e3:.2f}ms"


def trace_pod(pod: str, path: Path | None, depth: int, out: Console, err: Console) -> int:
    """Draw pod ``namespace/name``'s story from the spans in ``path``; the exit status.

    0 when drawn, 1 when no span names the pod, 2 when the arguments or the file are unusable;
    every failure is one line on ``err``.
    """
    namespace, sep, name = pod.partition("/")
    if not (sep and namespace and name) or "/" in name:
        return _fail(err, 2, f"expected NAMESPACE/NAME, e.g. ml-team/trainer-0, not {pod!r}")
    if path is None:
        hint = f"pass --file or set {SPANS_VARIABLE} (`rgpu up --sim` prints it)"
        return _fail(err, 2, f"no span file: {hint}")
    try:
        spans = read_spans(path)
    except OSError as exc:
        return _fail(err, 2, f"cannot read spans from {path}: {exc.strerror or exc}")
    story = find_story(spans, namespace, name)
    if story is None:
        return _fail(err, 1, _unknown(pod, path, spans))
    for line in render_story(story, width=out.width, depth=depth, unicode=_unicode(out)):
        out.print(line, no_wrap=True, overflow="ellipsis", crop=True, highlight=False)
    return 0


def _unknown(pod: str, path: Path, spans: Sequence[SpanRecord]) -> str:
    if not spans:
        return (
            f"no spans in {path} yet: the services send theirs every half second (a stack "
            "started with --otlp-endpoint sends them there instead)"
        )
    traces = len({span.trace_id for span in spans})
    return (
        f"no span names pod {pod} in {path} ({len(spans)} spans of {traces} traces); "
        "check the name with kubectl get pods"
    )


def _fail(err: Console, status: int, message: str) -> int:
    err.print(f"rgpu trace: {message}", soft_wrap=True, highlight=False, markup=False)
    return status


def _unicode(console: Console) -> bool:
    return console.encoding.lower().replace("-", "") == "utf8"
