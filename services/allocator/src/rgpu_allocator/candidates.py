"""At the filter, kube-scheduler hands the allocator the nodes a pod may run on; at admission
nobody does, and locality still wants the server near where the pod will run. So admission
works out the candidate client nodes itself from the pod's ``nodeSelector`` and required node
affinity, as kube-scheduler reads them, over the client nodes discovery publishes.

Discovery publishes the configured topology labels of each client node, which are exactly
the labels locality compares; a requirement on any other label cannot change which servers
are near, so it is taken as met (kube-scheduler still enforces it when it places the pod).
"""

from __future__ import annotations

from collections.abc import Mapping

from rgpu_contracts import NodeName
from rgpu_placement import FleetView

from .gated import Expression, Placement

__all__ = ["MEMO_KEPT", "Candidates"]

MEMO_KEPT = 1024
"""Distinct placements remembered per topology; past it the memo starts over (bounded)."""


def _number(text: str) -> int | None:
    stripped = text.lstrip("-")
    return int(text) if stripped.isdigit() and len(stripped) <= 18 else None


def _meets(labels: Mapping[str, str], expression: Expression, known: frozenset[str]) -> bool:
    key, operator, values = expression
    if key not in known:
        return True
    value = labels.get(key)
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, bound = _number(value), _number(values[0])
        if have is not None and bound is not None:
            return have > bound if operator == "Gt" else have < bound
    return False


def _allows(labels: Mapping[str, str], placement: Placement, known: frozenset[str]) -> bool:
    for key, value in placement.selector:
        if key in known and labels.get(key) != value:
            return False
    if not placement.terms:
        return True
    return any(all(_meets(labels, e, known) for e in term) for term in placement.terms)


class Candidates:
    """The client nodes a placement allows, remembered per placement for one topology."""

    __slots__ = ("_labels", "_memo")

    def __init__(self) -> None:
        self._labels: Mapping[str, Mapping[str, str]] | None = None
        self._memo: dict[Placement, tuple[NodeName, ...] | None] = {}

    def of(self, view: FleetView, placement: Placement) -> tuple[NodeName, ...] | None:
        """The nodes ``placement`` allows; ``None`` when it allows every client node (no
        preference), ``()`` when it allows none."""
        if placement.anywhere:
            return None
        if self._labels is not view.node_labels:
            self._labels, self._memo = view.node_labels, {}
        if placement not in self._memo:
            if len(self._memo) >= MEMO_KEPT:
                self._memo.clear()
            self._memo[placement] = _allowed(view, placement)
        return self._memo[placement]


def _allowed(view: FleetView, placement: Placement) -> tuple[NodeName, ...] | None:
    known = frozenset(view.topology_keys)
    nodes = view.node_labels
    allowed = tuple(NodeName(n) for n, labels in nodes.items() if _allows(labels, placement, known))
    return None if len(allowed) == len(nodes) else allowed
