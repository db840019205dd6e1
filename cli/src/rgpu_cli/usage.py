"""``rgpu usage`` answers "who used how many card-hours": from Prometheus when there is one
(``--prometheus URL``: the increase of ``rgpu_namespace_card_seconds_total`` over ``--since``,
summed per namespace across the exporter replicas that held it), otherwise from the claims
held now (the allocator's ``GET /v1/claims``: what each namespace holds at this moment and how
long those claims have held it within the window; finished pods are not in it, which the output
says)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import httpx

from rgpu_contracts import Claim, ClaimSet

__all__ = [
    "PROMQL",
    "SpanError",
    "Usage",
    "UsageRow",
    "from_claims",
    "from_prometheus",
    "parse_since",
]

PROMQL: Final = "sum by (namespace) (increase(rgpu_namespace_card_seconds_total[{since}]))"
_SPAN: Final = re.compile(r"(\d+)([smhdw])")
_UNIT: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_SPAN: Final = 400 * 86400
"""A bit over a year: what Prometheus keeps at most in practice."""


class SpanError(ValueError):
    """``--since`` is not a duration like ``30m``, ``24h`` or ``7d``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageRow:
    """One namespace: card-hours in the window, and cards held now (when known)."""

    namespace: str
    card_hours: float
    held_now: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """The rows, largest first, and where they came from."""

    rows: tuple[UsageRow, ...]
    source: str


def parse_since(text: str) -> tuple[str, float]:
    """``text`` as Prometheus writes a range (``24h``) and as seconds; raises ``SpanError``."""
    match = _SPAN.fullmatch(text.strip())
    if match is None:
        raise SpanError(f"--since {text!r}: write a duration like 30m, 24h or 7d")
    seconds = int(match.group(1)) * _UNIT[match.group(2)]
    if not 0 < seconds <= MAX_SPAN:
        raise SpanError(f"--since {text!r}: must be between 1s and 400d")
    return match.group(0), float(seconds)


async def from_prometheus(url: str, since: str, *, timeout: float = 10.0) -> Usage:
    """Card-hours per namespace over ``since`` from Prometheus' query API; raises
    ``httpx.HTTPError`` or ``ValueError`` naming what Prometheus answered."""
    span, _ = parse_since(since)
    query = PROMQL.format(since=span)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        answer = await client.get("/api/v1/query", params={"query": query})
    body = _json(answer)
    if answer.status_code != 200 or body.get("status") != "success":
        raise ValueError(
            f"Prometheus answered {answer.status_code}: {body.get('error') or answer.text[:200]}"
        )
    rows = (_row(sample) for sample in _vector(body))
    return Usage(rows=_sorted(rows), source=f"Prometheus {url}, {query}")


def _json(answer: httpx.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        raise ValueError(
            f"Prometheus answered {answer.status_code} without JSON: {answer.text[:200]}"
        ) from None
    if not isinstance(body, dict):
        raise ValueError("Prometheus answered JSON that is not an object")
    return body


def _vector(body: dict[str, Any]) -> list[dict[str, Any]]:
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise ValueError("Prometheus answered no instant vector for the query")
    result = data.get("result")
    return [r for r in result if isinstance(r, dict)] if isinstance(result, list) else []


def _row(sample: dict[str, Any]) -> UsageRow:
    metric = sample.get("metric") or {}
    value = sample.get("value") or [0, "0"]
    try:
        seconds = float(value[1])
    except (IndexError, TypeError, ValueError):
        raise ValueError(f"Prometheus answered an unreadable sample {sample!r:.200}") from None
    return UsageRow(namespace=str(metric.get("namespace", "")), card_hours=seconds / 3600)


def from_claims(claims: ClaimSet, since_seconds: float, *, now: float | None = None) -> Usage:
    """What the claims held now add up to: per namespace, the cards held and their card-hours
    since each claim was booked, within the last ``since_seconds``."""
    at = time.time() if now is None else now
    start = at - since_seconds
    held: dict[str, int] = {}
    hours: dict[str, float] = {}
    for claim in claims.claims:
        namespace = claim.pod.namespace
        held[namespace] = held.get(namespace, 0) + len(claim.cards)
        hours[namespace] = hours.get(namespace, 0.0) + _hours(claim, start, at)
    rows = (UsageRow(namespace=ns, card_hours=hours[ns], held_now=held[ns]) for ns in held)
    return Usage(rows=_sorted(rows), source="claims held now (finished pods are not counted)")


def _hours(claim: Claim, start: float, now: float) -> float:
    return len(claim.cards) * max(0.0, now - max(start, claim.booked_at)) / 3600


def _sorted(rows: Iterable[UsageRow]) -> tuple[UsageRow, ...]:
    return tuple(sorted(rows, key=lambda r: (-r.card_hours, r.namespace)))
