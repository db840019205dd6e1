"""Admission considers units, not pods: a pod alone, or a gang — pods labelled ``rgpu.io/gang``
in one namespace, admitted together or not at all, since a job that gets half its GPUs holds
them while it waits for the rest and two such jobs deadlock the pool. A gang is a unit once
every member exists (``rgpu.io/gang-size`` of them, all agreeing on the size); until then it
waits, holding nothing, with the reason said.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rgpu_placement import MAX_GANG_SIZE, Gang

from .pods import PodInfo
from .verdicts import Wait

__all__ = ["Unit", "units_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """One pod, or the members of one gang in queue order."""

    pods: tuple[PodInfo, ...]
    gang: Gang | None = None
    problem: tuple[Wait, str] | None = None
    """Why the gang cannot be admitted as it stands (it waits, holding nothing)."""

    @property
    def namespace(self) -> str:
        return self.pods[0].namespace

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.pods)


def _gang(pod: PodInfo) -> Gang | None:
    return pod.gated.gang if pod.gated is not None else None


def _problem(gang: Gang, members: list[PodInfo]) -> tuple[Wait, str] | None:
    label = f"gang {gang.name}"
    sizes = sorted({s for m in members if (g := _gang(m)) is not None for s in [g.size]}, key=str)
    if None in sizes:
        why = f"rgpu.io/gang-size must be a whole number from 1 to {MAX_GANG_SIZE} on every member"
        return Wait.GANG_INVALID, f"{label}: {why}"
    if len(sizes) > 1:
        return Wait.GANG_INVALID, f"{label}: members disagree on rgpu.io/gang-size ({sizes})"
    size = sizes[0]
    assert size is not None
    if len(members) > size:
        why = f"{len(members)} waiting pods carry the gang's label, its size says {size}"
        return Wait.GANG_INVALID, f"{label}: {why}"
    if len(members) < size:
        return Wait.GANG_INCOMPLETE, f"{label}: {len(members)} of {size} members exist"
    return None


def units_of(pods: Iterable[PodInfo]) -> list[Unit]:
    """``pods`` (in queue order) as units; a gang stands where its first member does."""
    units: list[Unit] = []
    gangs: dict[Gang, list[PodInfo]] = {}
    for pod in pods:
        gang = _gang(pod)
        if gang is None:
            units.append(Unit(pods=(pod,)))
            continue
        key = Gang(namespace=gang.namespace, name=gang.name, size=None)
        if key not in gangs:
            gangs[key] = []
            units.append(Unit(pods=(), gang=key))
        gangs[key].append(pod)
    return [u if u.gang is None else _complete(u.gang, gangs[u.gang]) for u in units]


def _complete(key: Gang, members: list[PodInfo]) -> Unit:
    return Unit(pods=tuple(members), gang=key, problem=_problem(key, members))
