"""A publisher that answers "what changed since revision R" (the fleet, the claims) must
remember which entries each of its recent revisions changed, bounded, and fold them the same
way whoever publishes.

A ``Changelog`` is immutable: each publication makes the next one with ``then``, so a
snapshot and its changelog never disagree, whichever a request got. It can answer from its
``base`` (the oldest revision whose successors it still remembers) up to its ``newest``.

Revisions need not be consecutive (they may come from the apiserver's resourceVersions, so
that replicas agree on them). A revision ``R`` between two recorded ones ``A < R < B`` is
read as "the state of ``A``": a revision names the state that reflects every change up to
it, and nothing changed between ``A`` and ``B`` but what ``B`` records.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = ["CHANGELOG_LIMIT", "Changelog", "Changes"]

CHANGELOG_LIMIT: Final = 256
"""Revisions remembered: a follower is never more than one long-poll behind (about as many
revisions as changes in a hold, usually a handful), so 256 covers a burst of changes while
it reconnects; further back, a full answer is right anyway."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Changes:
    """Names of entries changed (or added) and removed between two revisions."""

    changed: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class _Step:
    revision: int
    changes: Changes


class Changelog:
    """The changes of the last ``limit`` revisions up to ``newest``."""

    __slots__ = ("_base", "_limit", "_steps")

    def __init__(self, base: int, *, limit: int = CHANGELOG_LIMIT) -> None:
        self._base = base
        self._limit = limit
        self._steps: tuple[_Step, ...] = ()

    @property
    def base(self) -> int:
        """The oldest revision changes can be told from."""
        return self._base

    @property
    def newest(self) -> int:
        """The revision of the last recorded change (``base`` when none is)."""
        return self._steps[-1].revision if self._steps else self._base

    def then(
        self, revision: int, changed: Iterable[str] = (), removed: Iterable[str] = ()
    ) -> Changelog:
        """This changelog followed by ``revision``'s changes, the oldest forgotten past the
        limit. Raises ``ValueError`` when ``revision`` does not follow ``newest``."""
        if revision <= self.newest:
            raise ValueError(f"revision {revision} does not follow {self.newest}")
        step = _Step(revision, Changes(changed=frozenset(changed), removed=frozenset(removed)))
        steps = (*self._steps, step)
        base = self._base
        if len(steps) > self._limit:
            base, steps = steps[0].revision, steps[1:]
        log = Changelog(base, limit=self._limit)
        log._steps = steps
        return log

    def since(self, revision: int) -> Changes | None:
        """What changed after ``revision`` up to ``newest``; ``None`` when ``revision`` is
        outside what is remembered (older than ``base`` or past ``newest``)."""
        if not self._base <= revision <= self.newest:
            return None
        changed: set[str] = set()
        removed: set[str] = set()
        first = bisect_right(self._steps, revision, key=_revision)
        for step in self._steps[first:]:
            changed.difference_update(step.changes.removed)
            removed.difference_update(step.changes.changed)
            changed.update(step.changes.changed)
            removed.update(step.changes.removed)
        return Changes(changed=frozenset(changed), removed=frozenset(removed))


def _revision(step: _Step) -> int:
    return step.revision
