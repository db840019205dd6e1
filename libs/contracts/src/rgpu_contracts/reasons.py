"""Refusals must read exactly like HAMi's, so operators' alerts and
muscle memory keep working; rgpu adds a few reasons of its own for what HAMi cannot see."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from . import _validate as v
from .errors import ContractError

__all__ = ["Reason", "ReasonCount", "ReasonCountDict", "parse_reasons", "render_reasons"]


class Reason(enum.StrEnum):
    """Why a card (or, for ``NodeInsufficientDevice``, a server) cannot serve a pod."""

    CARD_NOT_HEALTH = "CardNotHealth"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
    SERVER_NOT_READY = "ServerNotReady"
    SERVER_UNREACHABLE = "ServerUnreachable"
    CARD_BUSY_ON_SERVER = "CardBusyOnServer"
    NO_SERVERS = "NoServers"
    SERVER_CORDONED = "ServerCordoned"
    CARD_CORDONED = "CardCordoned"
    CUDA_VERSION_MISMATCH = "CudaVersionMismatch"


class ReasonCountDict(TypedDict):
    reason: str
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasonCount:
    """``count`` of ``total`` cards (or servers) were refused for ``reason``."""

    reason: Reason
    count: int

    def to_dict(self) -> ReasonCountDict:
        return {"reason": self.reason.value, "count": self.count}

    @classmethod
    def from_dict(cls, raw: object, path: str = "") -> ReasonCount:
        m = v.as_mapping(raw, path)
        name = v.choice(m, "reason", path, [r.value for r in Reason])
        return cls(reason=Reason(name), count=v.integer(m, "count", path, minimum=0))


def render_reasons(counts: Mapping[Reason, int] | Iterable[ReasonCount], total: int) -> str:
    """Render HAMi's text: ``"<n>/<total> <Reason>"`` sorted by reason name, joined by ``", "``."""
    pairs = counts.items() if isinstance(counts, Mapping) else ((c.reason, c.count) for c in counts)
    parts = sorted((reason.value, n) for reason, n in pairs if n > 0)
    return ", ".join(f"{n}/{total} {name}" for name, n in parts)


def parse_reasons(text: str) -> tuple[tuple[ReasonCount, ...], int]:
    """Parse HAMi's reason text back into counts and the total it was rendered with."""
    if not text:
        return (), 0
    counts: list[ReasonCount] = []
    total = 0
    for i, part in enumerate(text.split(", ")):
        count, total, reason = _parse_part(part, f"[{i}]")
        counts.append(ReasonCount(reason=reason, count=count))
    return tuple(counts), total


def _parse_part(part: str, path: str) -> tuple[int, int, Reason]:
    fraction, _, name = part.partition(" ")
    n, _, total = fraction.partition("/")
    if not (n.isdigit() and total.isdigit()):
        raise ContractError(path, f"expected '<n>/<total> <Reason>', got {part!r}")
    try:
        return int(n), int(total), Reason(name)
    except ValueError:
        raise ContractError(path, f"unknown reason {name!r}") from None
