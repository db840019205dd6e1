"""Merge, strategic-merge and JSON patch semantics."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery._patching import (
    PatchError,
    json_patch,
    merge_patch,
    parse_pointer,
    strategic_merge_patch,
)

POD = {
    "metadata": {"name": "p", "resourceVersion": "4521", "annotations": {"keep": "1"}},
    "spec": {
        "containers": [
            {"name": "a", "image": "x:1", "env": [{"name": "A", "value": "1"}]},
            {"name": "b", "image": "y:1"},
        ]
    },
    "status": {"conditions": [{"type": "Ready", "status": "False"}]},
}


def test_merge_patch_sets_and_deletes_annotations(fixture: Callable[[str], Any]) -> None:
    examples = fixture("patch-annotations-examples.json")["merge_patch"]
    with_endpoint = merge_patch(POD, examples["set"])
    assert with_endpoint["metadata"]["annotations"] == {
        "keep": "1",
        "hami.io/lupine-endpoint": "10.0.3.50:50051",
    }
    assert merge_patch(with_endpoint, examples["delete"])["metadata"]["annotations"] == {
        "keep": "1"
    }


def test_merge_patch_replaces_lists_and_leaves_the_input_untouched() -> None:
    original = copy.deepcopy(POD)
    patched = merge_patch(POD, {"spec": {"containers": [{"name": "c"}]}})
    assert patched["spec"]["containers"] == [{"name": "c"}]
    assert original == POD


def test_strategic_merge_equals_merge_for_maps(fixture: Callable[[str], Any]) -> None:
    examples = fixture("patch-annotations-examples.json")
    smp, mp = examples["strategic_merge_patch"], examples["merge_patch"]
    assert strategic_merge_patch(POD, smp["set"]) == merge_patch(POD, mp["set"])
    assert strategic_merge_patch(POD, smp["delete"]) == merge_patch(POD, mp["delete"])


def test_strategic_merge_merges_keyed_lists_by_merge_key() -> None:
    patch = {
        "spec": {"containers": [{"name": "b", "image": "y:2"}, {"name": "c", "image": "z:1"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    result = strategic_merge_patch(copy.deepcopy(POD), patch)
    assert [(c["name"], c["image"]) for c in result["spec"]["containers"]] == [
        ("a", "x:1"),
        ("b", "y:2"),
        ("c", "z:1"),
    ]
    assert result["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    assert result["status"]["conditions"] == [{"type": "Ready", "status": "True"}]


def test_strategic_merge_directives() -> None:
    deleted = strategic_merge_patch(
        copy.deepcopy(POD), {"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}
    )
    assert [c["name"] for c in deleted["spec"]["containers"]] == ["b"]
    replaced = strategic_merge_patch(
        copy.deepcopy(POD), {"metadata": {"annotations": {"$patch": "replace", "x": "y"}}}
    )
    assert replaced["metadata"]["annotations"] == {"x": "y"}
    ordered = strategic_merge_patch(
        copy.deepcopy(POD), {"$setElementOrder/x": [], "metadata": {"labels": {"a": "b"}}}
    )
    assert ordered["metadata"]["labels"] == {"a": "b"} and "$setElementOrder/x" not in ordered
    pruned = strategic_merge_patch({"a": [1, 2, 3]}, {"$deleteFromPrimitiveList/a": [2]})
    assert pruned == {"a": [1, 3]}
    retained = strategic_merge_patch({"a": 1, "b": 2}, {"$retainKeys": ["b"], "b": 3})
    assert retained == {"b": 3}


def test_json_patch_fixture_operations(fixture: Callable[[str], Any]) -> None:
    examples = fixture("patch-annotations-examples.json")["json_patch"]
    doc = copy.deepcopy(POD)
    doc = json_patch(doc, examples["set_when_annotations_exist"])
    assert doc["metadata"]["annotations"]["hami.io/remote-gpu-endpoint"] == "10.0.3.50:50051"
    doc = json_patch(doc, examples["delete"])
    assert "hami.io/remote-gpu-endpoint" not in doc["metadata"]["annotations"]
    bare = json_patch({"metadata": {}}, examples["set_when_annotations_missing"])
    assert bare["metadata"]["annotations"] == {"hami.io/lupine-endpoint": "10.0.3.50:50051"}
    assert json_patch(copy.deepcopy(POD), examples["conditional_set"])["metadata"]["annotations"]


def test_json_patch_failed_test_raises_patch_error(fixture: Callable[[str], Any]) -> None:
    ops = fixture("patch-annotations-examples.json")["json_patch"]["conditional_set"]
    stale = copy.deepcopy(POD)
    stale["metadata"]["resourceVersion"] = "1"
    with pytest.raises(PatchError, match="testing value /metadata/resourceVersion failed"):
        json_patch(stale, ops)


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "add", "path": "/metadata/missing/key", "value": 1}],
        [{"op": "remove", "path": "/metadata/nope"}],
        [{"op": "replace", "path": "/metadata/nope", "value": 1}],
        [{"op": "add", "path": "/spec/containers/9", "value": {}}],
        [{"op": "frobnicate", "path": "/metadata"}],
        [{"op": "test", "path": "/metadata/name", "value": "q"}],
        [{"op": "test", "path": "/missing", "value": None}],
    ],
)
def test_json_patch_operations_that_do_not_apply_raise(ops: list[dict[str, Any]]) -> None:
    with pytest.raises(PatchError):
        json_patch(copy.deepcopy(POD), ops)


def test_json_patch_that_is_not_a_list_is_a_400() -> None:
    with pytest.raises(ApiError) as caught:
        json_patch({}, {"op": "add"})
    assert caught.value.code == 400


def test_json_patch_move_copy_and_array_append() -> None:
    doc = {"a": {"b": 1}, "list": [1]}
    doc = json_patch(
        doc,
        [{"op": "copy", "from": "/a/b", "path": "/c"}, {"op": "move", "from": "/a", "path": "/d"}],
    )
    doc = json_patch(
        doc,
        [
            {"op": "add", "path": "/list/-", "value": 2},
            {"op": "add", "path": "/list/0", "value": 0},
        ],
    )
    assert doc == {"c": 1, "d": {"b": 1}, "list": [0, 1, 2]}


def test_json_patch_test_distinguishes_booleans_from_numbers() -> None:
    with pytest.raises(PatchError):
        json_patch({"a": True}, [{"op": "test", "path": "/a", "value": 1}])
    assert json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 1.0}]) == {"a": 1}


def test_pointer_unescaping() -> None:
    assert parse_pointer("/metadata/annotations/hami.io~1x~0y") == [
        "metadata",
        "annotations",
        "hami.io/x~y",
    ]
    assert parse_pointer("") == []
    with pytest.raises(PatchError):
        parse_pointer("metadata")


_keys = st.sampled_from(["a", "b", "c/d", "e~f"])
_scalars = st.one_of(st.integers(-3, 3), st.text(max_size=2), st.booleans(), st.none())
_documents = st.recursive(
    _scalars,
    lambda inner: st.dictionaries(_keys, inner, max_size=3) | st.lists(inner, max_size=3),
    max_leaves=8,
)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


@st.composite
def _add_or_remove(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = draw(st.dictionaries(_keys, _documents, min_size=1, max_size=3))
    key = draw(st.sampled_from(sorted(doc)))
    if draw(st.booleans()):
        return doc, [{"op": "remove", "path": f"/{_escape(key)}"}]
    return doc, [{"op": "add", "path": f"/{_escape(key)}", "value": draw(_documents)}]


@settings(deadline=None)
@given(_add_or_remove())
def test_json_patch_agrees_with_the_reference_library(
    case: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    doc, ops = case
    expected = jsonpatch.apply_patch(copy.deepcopy(doc), ops)
    assert json_patch(copy.deepcopy(doc), ops) == expected


@settings(deadline=None)
@given(
    st.dictionaries(_keys, _documents, max_size=3), st.dictionaries(_keys, _documents, max_size=3)
)
def test_merge_patch_is_idempotent(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once
