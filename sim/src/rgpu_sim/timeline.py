"""Operators would rather look at who held which server when than read 200 rows. The demo and
``rgpu simulate`` draw it: one lane per server with a bar per pod while it held cards (as tall
as its share of the server's cards, at the height of its first card), the server's utilisation
at the lane's end, and the whole fleet's held share over time beneath. Plain SVG written here,
no plotting dependency: it opens in any browser and renders on GitHub.

The output depends only on the holds given, so a seeded simulation draws the same file every
time (the README's picture is checked against a fresh drawing).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

__all__ = ["Hold", "Panel", "timeline_svg"]

WIDTH = 960
LEFT = 110
"""Room for server names."""
RIGHT = 60
"""Room for each lane's utilisation."""
LANE = 16
"""Height of a server's lane, shrunk for large fleets (see ``_lane``)."""
CHART = 90
"""Height of the utilisation chart under the lanes."""
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"


@dataclass(frozen=True, slots=True, kw_only=True)
class Hold:
    """Pod ``pod`` holding ``cards`` cards of ``server`` from card ``first`` on, from ``start``
    to ``end`` (seconds since the panel's origin)."""

    server: str
    pod: str
    start: float
    end: float
    first: int = 0
    cards: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    """One timeline: its title, the servers in lane order with their card counts, the holds."""

    title: str
    servers: tuple[tuple[str, int], ...]
    holds: tuple[Hold, ...]
    span: float
    """Seconds shown (the holds are clipped to it)."""

    @property
    def total_cards(self) -> int:
        return sum(cards for _, cards in self.servers)


def _color(pod: str) -> str:
    hue = int.from_bytes(hashlib.blake2b(pod.encode(), digest_size=2).digest(), "big") % 360
    return f"hsl({hue},55%,55%)"


def _lane(servers: int) -> float:
    return max(3.0, min(LANE, 700 / max(servers, 1)))


_STEPS = (
    *((step, step, "s") for step in (0.5, 1, 2, 5, 10, 15, 30)),
    *((60 * step, step, "m") for step in (1, 2, 5, 10, 15, 30)),
    *((3600 * step, step, "h") for step in (1, 2, 3, 6, 12, 24)),
)
"""(seconds, in its unit, unit): the tick spacings a reader counts in without arithmetic."""


def _ticks(span: float) -> tuple[float, float, str]:
    """The spacing giving about eight ticks, with the unit its labels use."""
    wanted = span / 8
    return next((t for t in _STEPS if t[0] >= wanted), _STEPS[-1])


def _held_share(panel: Panel, server: str, cards: int) -> float:
    held = sum(
        (min(h.end, panel.span) - max(h.start, 0.0)) * h.cards
        for h in panel.holds
        if h.server == server and h.end > h.start
    )
    return held / (cards * panel.span) if panel.span > 0 and cards else 0.0


def _steps(panel: Panel) -> list[tuple[float, int]]:
    """(time, cards held from then on), for the fleet-wide chart."""
    changes: dict[float, int] = {}
    for hold in panel.holds:
        start, end = max(hold.start, 0.0), min(hold.end, panel.span)
        if end > start:
            changes[start] = changes.get(start, 0) + hold.cards
            changes[end] = changes.get(end, 0) - hold.cards
    steps, held = [(0.0, 0)], 0
    for at in sorted(changes):
        held += changes[at]
        steps.append((at, held))
    return steps


class _Canvas:
    """SVG elements in drawing order, with the panel's time-to-x mapping."""

    def __init__(self, span: float) -> None:
        self.parts: list[str] = []
        self.span = span
        self.plot = WIDTH - LEFT - RIGHT

    def x(self, seconds: float) -> float:
        return LEFT + self.plot * min(max(seconds, 0.0), self.span) / (self.span or 1.0)

    def text(self, x: float, y: float, body: str, anchor: str = "start", extra: str = "") -> None:
        self.parts.append(
            f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' {FONT} font-size='11' {extra}>"
            f"{escape(body)}</text>"
        )

    def rect(self, x: float, y: float, w: float, h: float, style: str, tip: str = "") -> None:
        title = f"<title>{escape(tip)}</title>" if tip else ""
        self.parts.append(
            f"<rect x='{x:.1f}' y='{y:.1f}' width='{max(w, 0.5):.1f}' height='{h:.1f}' "
            f"{style}>{title}</rect>"
        )


def _lanes(canvas: _Canvas, panel: Panel, top: float) -> float:
    lane = _lane(len(panel.servers))
    label_every = max(1, math.ceil(11 / lane))
    for row, (server, cards) in enumerate(panel.servers):
        y = top + row * lane
        shade = "#f4f4f4" if row % 2 else "#ffffff"
        canvas.rect(LEFT, y, canvas.plot, lane, f"fill='{shade}'")
        if row % label_every == 0:
            canvas.text(LEFT - 6, y + min(lane, 12) - 2, server, "end")
            share = _held_share(panel, server, cards)
            canvas.text(WIDTH - RIGHT + 6, y + min(lane, 12) - 2, f"{share:.0%}")
        for hold in (h for h in panel.holds if h.server == server):
            x0, x1 = canvas.x(hold.start), canvas.x(hold.end)
            y0 = y + lane * hold.first / max(cards, 1)
            height = lane * hold.cards / max(cards, 1)
            tip = f"{hold.pod}: {hold.cards} card(s), {hold.start:.1f}s to {hold.end:.1f}s"
            style = f"fill='{_color(hold.pod)}' stroke='#ffffff' stroke-width='0.5'"
            canvas.rect(x0, y0, x1 - x0, height, style, tip)
    if lane >= 6:  # lanes apart, over the bars that fill them
        for row in range(1, len(panel.servers)):
            y = top + row * lane
            canvas.parts.append(
                f"<line x1='{LEFT}' y1='{y:.1f}' x2='{LEFT + canvas.plot}' y2='{y:.1f}' "
                "stroke='#888888' stroke-width='0.6'/>"
            )
    return top + lane * len(panel.servers)


def _chart(canvas: _Canvas, panel: Panel, top: float) -> float:
    total = max(panel.total_cards, 1)
    canvas.rect(LEFT, top, canvas.plot, CHART, "fill='#fafafa' stroke='#cccccc'")
    points, last = [f"{LEFT:.1f},{top + CHART:.1f}"], top + CHART
    for at, held in _steps(panel):
        y = top + CHART * (1 - held / total)
        points += [f"{canvas.x(at):.1f},{last:.1f}", f"{canvas.x(at):.1f},{y:.1f}"]
        last = y
    points += [
        f"{canvas.x(panel.span):.1f},{last:.1f}",
        f"{canvas.x(panel.span):.1f},{top + CHART:.1f}",
    ]
    canvas.parts.append(
        f"<polygon points='{' '.join(points)}' fill='#4a78b8' fill-opacity='0.6' "
        "stroke='#2d5a94' stroke-width='1'/>"
    )
    mean = sum(_held_share(panel, s, c) * c for s, c in panel.servers) / total
    canvas.text(LEFT - 6, top + 12, "100%", "end")
    canvas.text(LEFT - 6, top + CHART, "0%", "end")
    canvas.text(LEFT - 6, top + CHART / 2 + 4, "cards held", "end")
    canvas.text(WIDTH - RIGHT + 6, top + CHART / 2 + 4, f"{mean:.0%}")
    return top + CHART


def _axis(canvas: _Canvas, top: float, bottom: float) -> None:
    seconds, count, unit = _ticks(canvas.span)
    n = 0
    while n * seconds <= canvas.span + 1e-9:
        x = canvas.x(n * seconds)
        canvas.parts.append(
            f"<line x1='{x:.1f}' y1='{top:.1f}' x2='{x:.1f}' y2='{bottom:.1f}' "
            "stroke='#999999' stroke-width='0.5' stroke-dasharray='2,3'/>"
        )
        canvas.text(x, bottom + 13, f"{n * count:g}{unit}", "middle")
        n += 1


def _panel(panel: Panel, top: float) -> tuple[list[str], float]:
    canvas = _Canvas(panel.span)
    canvas.text(LEFT, top + 14, panel.title, extra="font-weight='bold'")
    canvas.text(WIDTH - RIGHT + 6, top + 14, "held", extra="fill='#666666'")
    lanes_top = top + 22
    lanes_end = _lanes(canvas, panel, lanes_top)
    chart_end = _chart(canvas, panel, lanes_end + 10)
    _axis(canvas, lanes_top, chart_end)
    return canvas.parts, chart_end + 30


def timeline_svg(panels: Sequence[Panel], *, title: str) -> str:
    """The panels stacked under ``title``, as an SVG document."""
    parts: list[str] = []
    top = 30.0
    for panel in panels:
        drawn, top = _panel(panel, top)
        parts += drawn
    head = (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{top:.0f}' "
        f"viewBox='0 0 {WIDTH} {top:.0f}'>"
        f"<rect width='100%' height='100%' fill='#ffffff'/>"
        f"<text x='{LEFT}' y='18' {FONT} font-size='14' font-weight='bold'>{escape(title)}</text>"
    )
    return "\n".join([head, *parts, "</svg>", ""])


def holds_of(holds: Iterable[Hold], origin: float) -> tuple[Hold, ...]:
    """``holds`` with times moved to start at ``origin``."""
    return tuple(
        Hold(
            server=h.server,
            pod=h.pod,
            start=h.start - origin,
            end=h.end - origin,
            first=h.first,
            cards=h.cards,
        )
        for h in holds
    )
