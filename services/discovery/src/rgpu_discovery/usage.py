"""Lupine reports which GPUs have clients only through its Prometheus
text exposition, and a busy set read wrongly hands an occupied server to a second tenant.

Busy GPUs are the distinct ``device_uuid`` label values of the
``lupine_client_device_memory_used_bytes`` samples, whatever their values (a client holding
zero bytes is still connected). Other metrics are skipped without being parsed; a sample of
that metric whose label set cannot be read makes the whole body unusable, because a partly
read body could silently drop a busy GPU.
"""

from __future__ import annotations

from typing import Final

from rgpu_contracts.ids import GpuUuid

__all__ = ["USAGE_METRIC", "UnreadableUsage", "busy_gpus"]

USAGE_METRIC: Final = "lupine_client_device_memory_used_bytes"
_ESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}


class UnreadableUsage(ValueError):
    """Raised when a usage sample's labels are malformed or lack ``device_uuid``."""


def busy_gpus(text: str) -> frozenset[GpuUuid]:
    """The GPUs with at least one client, from a lupine ``/metrics`` body.

    Raises ``UnreadableUsage`` naming the line when a usage sample cannot be read.
    """
    busy: set[GpuUuid] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith(USAGE_METRIC):
            continue
        rest = line[len(USAGE_METRIC) :]
        if rest[:1] == "{":
            busy.add(_device_uuid(rest, number))
        elif rest[:1] in (" ", "\t"):
            raise UnreadableUsage(f"line {number}: {USAGE_METRIC} sample without labels")
    return frozenset(busy)


def _device_uuid(rest: str, number: int) -> GpuUuid:
    try:
        labels = _labels(rest)
    except (IndexError, ValueError) as exc:
        raise UnreadableUsage(f"line {number}: malformed label set ({exc})") from None
    uuid = labels.get("device_uuid")
    if not uuid:
        raise UnreadableUsage(f"line {number}: {USAGE_METRIC} sample without device_uuid")
    return GpuUuid(uuid)


def _labels(text: str) -> dict[str, str]:
    """Parse ``{name="value",...}`` at the start of ``text`` (Prometheus text format 0.0.4)."""
    labels: dict[str, str] = {}
    pos = _skip_blanks(text, 1)
    while text[pos] != "}":
        eq = text.index("=", pos)
        name = text[pos:eq].strip()
        start = _skip_blanks(text, eq + 1)
        if not name or text[start] != '"':
            raise ValueError(f'expected name="value" at column {pos}')
        labels[name], pos = _quoted(text, start + 1)
        pos = _skip_blanks(text, pos)
        if text[pos] == ",":
            pos = _skip_blanks(text, pos + 1)
    return labels


def _skip_blanks(text: str, pos: int) -> int:
    while text[pos] in " \t":
        pos += 1
    return pos


def _quoted(text: str, pos: int) -> tuple[str, int]:
    """Read a label value up to its closing quote; returns the value and the next position."""
    out: list[str] = []
    while (char := text[pos]) != '"':
        if char == "\\":
            pos += 1
            out.append(_ESCAPES.get(text[pos], "\\" + text[pos]))
        else:
            out.append(char)
        pos += 1
    return "".join(out), pos + 1
