"""A pod that asks for ``nvidia.com/remote-gpus`` (one letter too many) asks for a resource no
node has: kube-scheduler keeps it Pending forever, and rgpu never sees it, since it asks for
no remote GPU. Both the webhook (an admission Warning at creation) and ``rgpu explain`` name
such look-alikes with the name that was probably meant, so the mistake is seen in seconds.

A look-alike is any other resource name that mentions both "remote" and "gpu" (what the
webhook's matchCondition sends it), or that differs from a served name by a slip (case,
punctuation, a letter or two).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._podreading import container_slots

__all__ = ["Lookalike", "lookalikes"]

_CLOSE = 0.85
"""``difflib`` similarity from which a name reads as a slip of a served one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Lookalike:
    """A resource a container asks for that resembles one rgpu serves."""

    container: str
    resource: str
    meant: str
    """The served resource it most resembles."""

    @property
    def message(self) -> str:
        return (
            f'container "{self.container}" asks for {self.resource}, which no node offers, so '
            f"the pod would wait forever: did you mean {self.meant}?"
        )


def _squashed(name: str) -> str:
    return re.sub(r"[^a-z0-9/]", "", name.lower())


def _meant(resource: str, count: str, memory: str) -> str | None:
    if resource in (count, memory):
        return None
    lowered = resource.lower()
    # A name that mentions memory meant the memory resource, any other the card count.
    best = memory if "mem" in lowered else count
    if "remote" in lowered and "gpu" in lowered:
        return best
    close = difflib.SequenceMatcher(None, lowered, best.lower()).ratio() >= _CLOSE
    return best if close or _squashed(resource) == _squashed(best) else None


def _asked(body: Mapping[str, Any]) -> list[str]:
    resources = body.get("resources")
    if not isinstance(resources, Mapping):
        return []
    names: list[str] = []
    for part in ("limits", "requests"):
        values = resources.get(part)
        if isinstance(values, Mapping):
            names += [str(k) for k in values if str(k) not in names]
    return names


def lookalikes(
    pod: Mapping[str, Any], *, count_resource: str, memory_resource: str
) -> tuple[Lookalike, ...]:
    """Every look-alike resource the pod's containers ask for, in pod order."""
    found = []
    for slot in container_slots(pod):
        for resource in _asked(slot.body):
            meant = _meant(resource, count_resource, memory_resource)
            if meant is not None:
                found.append(Lookalike(container=slot.name, resource=resource, meant=meant))
    return tuple(found)
