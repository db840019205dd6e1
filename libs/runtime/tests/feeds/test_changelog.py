"""The changelog: what changed after a revision, folded in order, bounded, immutable."""

from __future__ import annotations

import pytest

from rgpu_runtime.feeds import Changes
from rgpu_runtime.feeds._changelog import Changelog


def test_changes_after_a_revision_fold_every_later_step_in_order() -> None:
    log = Changelog(10).then(12, changed={"a"}).then(15, removed={"a"}, changed={"b"})
    log = log.then(20, changed={"a"})
    assert log.since(10) == Changes(changed=frozenset({"a", "b"}))
    assert log.since(12) == Changes(changed=frozenset({"a", "b"}))
    assert log.since(15) == Changes(changed=frozenset({"a"}))
    assert log.since(20) == Changes()


def test_an_entry_changed_then_removed_is_removed() -> None:
    log = Changelog(1).then(2, changed={"a"}).then(3, removed={"a"})
    assert log.since(1) == Changes(removed=frozenset({"a"}))


def test_a_revision_between_two_recorded_ones_reads_as_the_earlier() -> None:
    log = Changelog(100).then(140, changed={"a"}).then(180, changed={"b"})
    assert log.since(139) == log.since(100)
    assert log.since(141) == Changes(changed=frozenset({"b"}))


def test_revisions_outside_the_remembered_range_are_not_answered() -> None:
    log = Changelog(10).then(11, changed={"a"})
    assert (log.since(9), log.since(12)) == (None, None)


def test_past_the_limit_the_oldest_steps_are_forgotten() -> None:
    log = Changelog(0, limit=3)
    for revision in range(1, 6):
        log = log.then(revision, changed={f"s{revision}"})
    assert (log.base, log.newest) == (2, 5)
    assert log.since(1) is None
    assert log.since(2) == Changes(changed=frozenset({"s3", "s4", "s5"}))


def test_then_leaves_the_original_untouched_and_refuses_to_go_back() -> None:
    first = Changelog(5)
    second = first.then(6, changed={"a"})
    assert (first.newest, second.newest) == (5, 6)
    with pytest.raises(ValueError, match="does not follow 6"):
        second.then(6)
