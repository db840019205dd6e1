"""The pool is shared by teams, and who goes first when it is short is policy the allocator's
admission and ``rgpu simulate`` must apply alike: namespace quotas (cards held or admitted),
fair share by weight within a priority, and gangs admitted whole or not at all.

The configuration is a document (``queues.yaml`` of the ``rgpu-queues`` ConfigMap):

    default: {cards: 16, weight: 1}      # namespaces not listed; omit = no limit, weight 1
    namespaces:
      team-a: {cards: 8, weight: 2}

It is checked whole before it is used: an unknown key, a negative or non-integer value, a
namespace name Kubernetes would refuse, or a document over ``MAX_CONFIG_BYTES`` raises
``QueueConfigError`` naming the path and the fix, so a typo never turns into "no limit".
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from rgpu_contracts import Claim

from ._errors import PlacementError

__all__ = [
    "GANG_LABEL",
    "GANG_SIZE_LABEL",
    "MAX_CONFIG_BYTES",
    "MAX_GANG_SIZE",
    "NO_QUEUES",
    "FairWalk",
    "Gang",
    "QueueConfig",
    "QueueConfigError",
    "Quota",
    "cards_by_namespace",
    "gang_of",
]

T = TypeVar("T")

MAX_CONFIG_BYTES = 64 * 1024
"""Longest ``queues.yaml`` read; a ConfigMap may hold 1 MiB, a queue policy needs a few KiB."""
MAX_GANG_SIZE = 1024
"""Largest gang accepted: beyond any pool rgpu serves."""
GANG_LABEL = "rgpu.io/gang"
GANG_SIZE_LABEL = "rgpu.io/gang-size"
_MAX_CARDS = 1 << 20
_MAX_WEIGHT = 1000
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class QueueConfigError(PlacementError):
    """Raised when a queue configuration cannot be used; ``path`` names the culprit."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    """A namespace's share of the pool: at most ``cards`` held or admitted (``None``: no
    limit), and its ``weight`` in fair share."""

    cards: int | None = None
    weight: int = 1


def cards_by_namespace(claims: Iterable[Claim]) -> dict[str, int]:
    """Cards ``claims`` hold, per pod namespace: what quotas and usage count."""
    found: dict[str, int] = {}
    for claim in claims:
        namespace = claim.pod.namespace
        found[namespace] = found.get(namespace, 0) + len(claim.cards)
    return found


def _whole(raw: Mapping[str, object], key: str, path: str, low: int, high: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueueConfigError(f"{path}.{key}", f"expected a whole number, got {value!r}")
    if not low <= value <= high:
        raise QueueConfigError(f"{path}.{key}", f"expected {low}..{high}, got {value}")
    return value


def _quota(raw: object, path: str) -> Quota:
    if not isinstance(raw, Mapping):
        raise QueueConfigError(path, "expected a mapping like {cards: 8, weight: 1}")
    unknown = sorted(str(k) for k in raw if k not in ("cards", "weight"))
    if unknown:
        raise QueueConfigError(f"{path}.{unknown[0]}", "unknown key; expected cards or weight")
    weight = _whole(raw, "weight", path, 1, _MAX_WEIGHT)
    return Quota(cards=_whole(raw, "cards", path, 0, _MAX_CARDS), weight=weight or 1)


def _namespaces(raw: object) -> dict[str, Quota]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise QueueConfigError("namespaces", "expected a mapping of namespace -> quota")
    found = {}
    for name, quota in raw.items():
        if not isinstance(name, str) or not _NAMESPACE.fullmatch(name):
            raise QueueConfigError(f"namespaces.{name}", "not a Kubernetes namespace name")
        found[name] = _quota(quota, f"namespaces.{name}")
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueConfig:
    """Quotas and weights per namespace."""

    default: Quota = field(default_factory=Quota)
    namespaces: Mapping[str, Quota] = field(default_factory=dict)

    def quota(self, namespace: str) -> Quota:
        return self.namespaces.get(namespace, self.default)

    @classmethod
    def from_mapping(cls, raw: object) -> QueueConfig:
        """Check a parsed ``queues.yaml``; raises ``QueueConfigError`` naming the culprit."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise QueueConfigError("", "expected a mapping with default and namespaces")
        unknown = sorted(str(k) for k in raw if k not in ("default", "namespaces"))
        if unknown:
            raise QueueConfigError(unknown[0], "unknown key; expected default or namespaces")
        default = raw.get("default")
        return cls(
            default=Quota() if default is None else _quota(default, "default"),
            namespaces=_namespaces(raw.get("namespaces")),
        )


NO_QUEUES = QueueConfig()
"""No quota anywhere, every weight 1: first come, first served within a priority."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Gang:
    """Pods labelled ``rgpu.io/gang`` in one namespace, admitted together: ``size`` of them."""

    namespace: str
    name: str
    size: int | None
    """``None`` when the size label is missing or not a whole number in 1..MAX_GANG_SIZE."""


def gang_of(namespace: str, labels: Mapping[str, str]) -> Gang | None:
    """The gang a pod belongs to by its labels, if any."""
    name = labels.get(GANG_LABEL)
    if not name:
        return None
    text = labels.get(GANG_SIZE_LABEL, "")
    size = int(text) if text.isdigit() and len(text) <= 4 else None
    if size is not None and not 1 <= size <= MAX_GANG_SIZE:
        size = None
    return Gang(namespace=namespace, name=name, size=size)


class FairWalk(Generic[T]):
    """Units (pods or gangs) in admission order, for a pass that admits as it goes.

    Priority first; within a priority the namespace with the fewest cards held per unit of
    weight (counting what this walk admitted so far: ``took``), then the earliest unit; within
    a namespace, the units' own order. A unit that is not admitted does not hold its namespace
    back: the next call offers the namespace's next unit (backfill).
    """

    def __init__(
        self,
        units: Sequence[T],
        *,
        namespace: Callable[[T], str],
        priority: Callable[[T], int],
        held: Mapping[str, int],
        config: QueueConfig,
    ) -> None:
        self._namespace, self._config = namespace, config
        self._held = dict(held)
        lanes: dict[tuple[int, str], list[tuple[int, T]]] = {}
        for order, unit in enumerate(units):
            lanes.setdefault((-priority(unit), namespace(unit)), []).append((order, unit))
        self._lanes = lanes
        self._heap: list[tuple[int, float, int, str]] = []
        self._next = dict.fromkeys(lanes, 0)
        for key in lanes:
            self._push(key)

    def _share(self, namespace: str) -> float:
        return self._held.get(namespace, 0) / self._config.quota(namespace).weight

    def _push(self, key: tuple[int, str]) -> None:
        lane, at = self._lanes[key], self._next[key]
        if at < len(lane):
            heapq.heappush(self._heap, (key[0], self._share(key[1]), lane[at][0], key[1]))

    def __iter__(self) -> Iterator[T]:
        while self._heap:
            band, share, _, namespace = heapq.heappop(self._heap)
            key = (band, namespace)
            if share != self._share(namespace):
                self._push(key)  # its share moved since it was queued: take its place anew
                continue
            unit = self._lanes[key][self._next[key]][1]
            self._next[key] += 1
            yield unit
            self._push(key)

    def took(self, namespace: str, cards: int) -> None:
        """The unit just offered was admitted with ``cards`` of ``namespace``'s."""
        self._held[namespace] = self._held.get(namespace, 0) + cards

    def held(self, namespace: str) -> int:
        """Cards ``namespace`` holds, with what this walk admitted."""
        return self._held.get(namespace, 0)
