"""Label and field selector grammar and matching, as apimachinery defines them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery._resources import require
from rgpu_kubesim.machinery._selectors import (
    field_values,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
    selector_from_object,
)

GPU = {"app": "trainer", "tier": "gpu", "rank": "3"}
PLAIN = {"app": "web"}


@pytest.mark.parametrize(
    ("selector", "on_gpu", "on_plain"),
    [
        ("", True, True),
        ("tier", True, False),
        ("!tier", False, True),
        ("app=trainer", True, False),
        ("app==trainer", True, False),
        ("app!=trainer", False, True),
        ("tier!=gpu", False, True),
        ("app in (trainer, web)", True, True),
        ("app in (trainer)", True, False),
        ("tier notin (gpu)", False, True),
        ("tier notin (cpu)", True, True),
        ("app=trainer,tier=gpu", True, False),
        ("app=trainer , !missing", True, False),
        ("rank>2", True, False),
        ("rank<2", False, False),
        ("tier=", False, False),
    ],
)
def test_label_selector_matches_like_apimachinery(
    selector: str, on_gpu: bool, on_plain: bool
) -> None:
    parsed = parse_label_selector(selector)
    assert labels_match(parsed, GPU) is on_gpu
    assert labels_match(parsed, PLAIN) is on_plain


def test_empty_value_matches_empty_label_value() -> None:
    assert labels_match(parse_label_selector("tier="), {"tier": ""})


@pytest.mark.parametrize(
    "selector", ["app in trainer", "app=(x)", "a,", ",a", "app in (a", "a b", "Bad Key=x"]
)
def test_malformed_label_selector_is_a_400(selector: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_label_selector(selector)
    assert caught.value.code == 400
    assert caught.value.status["reason"] == "BadRequest"
    assert "unable to parse requirement" in caught.value.status["message"]


def test_label_selector_object_supports_match_labels_and_expressions() -> None:
    selector = selector_from_object(
        {
            "matchLabels": {"app": "trainer"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu"]},
                {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]},
                {"key": "rank", "operator": "Exists"},
                {"key": "skip", "operator": "DoesNotExist"},
            ],
        }
    )
    assert labels_match(selector, GPU)
    assert not labels_match(selector, {**GPU, "skip": "1"})
    assert not labels_match(selector, {**GPU, "hami.io/webhook": "ignore"})


def test_empty_label_selector_object_matches_everything() -> None:
    assert labels_match(selector_from_object({}), {}) and labels_match(
        selector_from_object(None), GPU
    )


def _pod_fields(**spec: object) -> dict[str, str]:
    obj = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": spec,
        "status": {"phase": "Pending"},
    }
    return field_values(require("pods"), obj)


def test_pod_field_values_read_missing_fields_as_empty() -> None:
    fields = _pod_fields(schedulerName="rgpu-scheduler")
    assert fields["spec.nodeName"] == ""
    assert fields["spec.schedulerName"] == "rgpu-scheduler"
    assert fields["status.phase"] == "Pending"
    assert fields["metadata.namespace"] == "ns"


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=", True),
        ("spec.nodeName!=", False),
        ("spec.schedulerName=rgpu-scheduler,status.phase=Pending", True),
        ("spec.schedulerName==default-scheduler", False),
        ("metadata.name!=q", True),
    ],
)
def test_pod_field_selector_matches(selector: str, expected: bool) -> None:
    parsed = parse_field_selector(selector, require("pods"))
    assert fields_match(parsed, _pod_fields(schedulerName="rgpu-scheduler")) is expected


def test_field_selector_unescapes_values() -> None:
    parsed = parse_field_selector(r"metadata.name=a\,b\=c", require("leases"))
    assert parsed[0].value == "a,b=c"


def test_boolean_fields_render_like_kube() -> None:
    fields = field_values(
        require("nodes"), {"metadata": {"name": "n"}, "spec": {"unschedulable": True}}
    )
    assert fields["spec.unschedulable"] == "true"


def test_unsupported_field_label_gives_kubes_message(fixture: Callable[[str], Any]) -> None:
    with pytest.raises(ApiError) as caught:
        parse_field_selector("spec.schedulerNam=x", require("pods"))
    assert caught.value.status == fixture("status-400-field-selector.json")


@pytest.mark.parametrize(
    ("plural", "field"), [("nodes", "spec.nodeName"), ("leases", "spec.holderIdentity")]
)
def test_field_selector_only_accepts_the_resources_labels(plural: str, field: str) -> None:
    with pytest.raises(ApiError):
        parse_field_selector(f"{field}=x", require(plural))


def test_field_selector_without_operator_is_a_400() -> None:
    with pytest.raises(ApiError) as caught:
        parse_field_selector("metadata.name", require("pods"))
    assert caught.value.code == 400
