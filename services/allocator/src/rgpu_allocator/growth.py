"""Pods refused for lack of room wait to be woken, and a new fleet from discovery is one of the
things that can make room: a server appearing or becoming usable (uncordoned among others), more
healthy cards, fewer busy or cordoned ones, a CUDA version learned. Only such a fleet wakes
them; any other change (a card turning busy, a relabel) would wake every refused pod for
nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from rgpu_placement import FleetView, ServerFacts

__all__ = ["capacity_grew", "wake_on_growth"]


def _usable(f: ServerFacts) -> bool:
    return f.problem is None and bool(f.healthy)


def _grew(old: ServerFacts | None, new: ServerFacts) -> bool:
    if not _usable(new):
        return False
    if old is None or not _usable(old):
        return True
    # An uncordoned card, or a CUDA version learned, can take a pod that waits for it.
    return (
        len(new.healthy) > len(old.healthy)
        or bool(old.busy - new.busy)
        or bool(old.cordoned - new.cordoned)
        or new.cuda_major != old.cuda_major
    )


def capacity_grew(old: FleetView | None, new: FleetView) -> bool:
    """Whether a server appeared, became usable (uncordoned among others), gained healthy
    cards, lost busy or cordoned ones, or changed CUDA version."""
    if old is None:
        return False
    return any(_grew(old.facts.get(name), f) for name, f in new.facts.items())


def wake_on_growth(wake: Callable[[], None]) -> Callable[[FleetView | None, FleetView], None]:
    """A fleet hook (``DiscoveryMirror.on_fleet``) that calls ``wake`` when capacity grew."""

    def fleet_taken(old: FleetView | None, new: FleetView) -> None:
        if capacity_grew(old, new):
            wake()

    return fleet_taken
