"""A publisher's snapshot: the whole body from cached entry JSON, and the update a follower
gets — only what changed since the revision it holds, laid out as its feed declares; the whole
set marked full when that revision is older than the changelog; ``behind`` when the snapshot is
below it; the plain body when it did not ask, or the feed has no updates."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from rgpu_runtime.feeds import Changes, Entry, Poll, Published
from rgpu_runtime.feeds._feed import DeltaLayout, Feed


@dataclass(frozen=True)
class Things:
    revision: int

    @classmethod
    def from_dict(cls, raw: object) -> Things:
        assert isinstance(raw, dict)
        return cls(revision=raw["revision"])


THINGS = Feed(path="/v1/things", key="things", decode=Things.from_dict, updates=Things.from_dict)
GROUPED = Feed(
    path="/v1/things",
    key="things",
    decode=Things.from_dict,
    updates=Things.from_dict,
    delta=DeltaLayout.GROUPED,
)
WHOLE = Feed(path="/v1/things", key="things", decode=Things.from_dict)


def snapshot(*names: str) -> Published[dict[str, str]]:
    items = [Entry.of(n, {"name": n}, dict) for n in names]
    return Published(THINGS, revision=7, fields={"at": 1.5}, entries=items)


def after(
    revision: int,
    previous: Published[dict[str, int]] | None,
    feed: Feed[Things] = THINGS,
    **values: int,
) -> Published[dict[str, int]]:
    items = [Entry.of(name, {name: value}, dict) for name, value in values.items()]
    return Published(feed, revision=revision, entries=items, previous=previous)


def poll(**query: str) -> Poll:
    return Poll.from_query(query)


def test_body_has_fields_then_sorted_items() -> None:
    body = snapshot("b", "a").body()
    assert orjson.loads(body) == {
        "revision": 7,
        "at": 1.5,
        "things": [{"name": "a"}, {"name": "b"}],
    }


def test_empty_snapshot_body_has_an_empty_list() -> None:
    assert orjson.loads(snapshot().body()) == {"revision": 7, "at": 1.5, "things": []}


def test_body_is_built_once_and_reused() -> None:
    published = snapshot("a")
    assert published.body() is published.body()


def test_values_are_sorted_by_name() -> None:
    assert snapshot("c", "a", "b").values == ({"name": "a"}, {"name": "b"}, {"name": "c"})


def test_past_the_changelog_limit_an_old_revision_gets_the_full_set() -> None:
    published = after(1, None, a=0)
    for revision in range(2, 300):
        published = after(revision, published, a=revision)
    assert published.update(1).startswith(b'{"kind":"full",')
    assert published.update(published.changelog.base).startswith(b'{"kind":"delta",')
    assert published.update(298) == (
        b'{"kind":"delta","revision":299,"since":298,"things":[{"a":299}],"removed":[]}'
    )


def test_an_update_body_is_built_once_per_since() -> None:
    first = after(1, None, a=1, b=1)
    second = after(2, first, a=2, b=1)
    assert second.update(1) is second.update(1)
    assert second.update(1) == (
        b'{"kind":"delta","revision":2,"since":1,"things":[{"a":2}],"removed":[]}'
    )


def test_changes_the_publisher_names_are_the_delta_without_comparing_entries() -> None:
    first = after(1, None, a=1, b=1)
    entries = {"a": Entry.of("a", {"a": 2}, dict), "b": Entry.of("b", {"b": 1}, dict)}
    told = Changes(changed=frozenset({"a"}))
    second = Published(THINGS, revision=2, entries=entries, previous=first, changes=told)
    assert second.changelog.since(1) == told
    assert len(second) == 2


def test_a_grouped_delta_names_every_group_changed_or_gone_and_joins_those_left() -> None:
    first = after(1, None, GROUPED, a=1, b=1, c=1)
    second = after(2, first, GROUPED, a=2, b=1)
    assert second.update(1) == (
        b'{"kind":"delta","revision":2,"since":1,"servers":["a","c"],"things":[{"a":2}]}'
    )


def test_an_answer_without_the_opt_in_is_the_body() -> None:
    published = after(2, after(1, None, a=1), a=2)
    assert published.answer(poll(since="1")) is published.body()


def test_an_answer_to_a_client_further_along_is_behind() -> None:
    published = after(2, after(1, None, a=1), a=2)
    assert orjson.loads(published.answer(poll(since="5", delta="1"))) == {
        "kind": "behind",
        "revision": 2,
        "since": 5,
    }


def test_an_answer_to_a_client_behind_is_the_update_since_its_revision() -> None:
    published = after(2, after(1, None, a=1), a=2)
    assert published.answer(poll(since="1", delta="1")) is published.update(1)
    assert published.answer(poll(delta="1")) is published.full_update()


def test_a_feed_without_updates_answers_the_body_even_when_asked_for_them() -> None:
    published = after(2, after(1, None, WHOLE, a=1), WHOLE, a=2)
    assert published.answer(poll(since="1", delta="1")) is published.body()
