from __future__ import annotations

import orjson

from rgpu_discovery.published import Item, Published


def snapshot(*names: str) -> Published[dict[str, str]]:
    items = [Item.of(n, {"name": n}, dict) for n in names]
    return Published(revision=7, listed=True, key="things", fields={"at": 1.5}, items=items)


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
