from __future__ import annotations

import base64
import json
from collections.abc import Callable

import jsonpatch
import pytest

from rgpu_contracts import (
    AdmissionRequest,
    ContractError,
    admission_allow,
    admission_deny,
    escape_pointer,
    pointer,
)

Load = Callable[[str], object]


def test_create_review_fixture_decodes(load_fixture: Load) -> None:
    request = AdmissionRequest.from_review(load_fixture("k8s/admission-review-pod-create.json"))
    assert request.operation == "CREATE"
    assert request.uid == "d2b7f0a4-9c3e-4f1b-8a6d-5e4c3b2a1f09"
    assert request.user.username == "kubernetes-admin"
    assert request.object is not None and request.object["metadata"]["name"] == "trainer-0"
    assert request.old_object is None


def test_allow_and_deny_match_fixture_shapes(load_fixture: Load) -> None:
    uid = "d2b7f0a4-9c3e-4f1b-8a6d-5e4c3b2a1f09"
    assert admission_allow(uid) == load_fixture("k8s/admission-review-response-allow.json")
    deny = load_fixture("k8s/admission-review-response-deny.json")
    message = "nvidia.com/remote-gpu must be an integer between 1 and 8"
    assert admission_deny(uid, message) == deny


def test_allow_with_patch_is_base64_jsonpatch_that_applies(load_fixture: Load) -> None:
    patch = load_fixture("k8s/admission-response-patch.decoded.json")
    assert isinstance(patch, list)
    review = admission_allow("u", patch)
    response = review["response"]
    assert isinstance(response, dict) and response["patchType"] == "JSONPatch"
    decoded = json.loads(base64.b64decode(response["patch"]))
    assert decoded == patch
    pod = {"metadata": {}, "spec": {"schedulerName": "default-scheduler"}}
    patched = jsonpatch.apply_patch(pod, decoded)
    assert patched["spec"]["schedulerName"] == "rgpu-scheduler"


def test_pointer_escapes_tilde_before_slash() -> None:
    assert escape_pointer("a~/b") == "a~0~1b"
    path = pointer("metadata", "annotations", "hami.io/lupine-endpoint")
    assert path == "/metadata/annotations/hami.io~1lupine-endpoint"
    doc = {"metadata": {"annotations": {"hami.io/lupine-endpoint": "x"}}}
    assert jsonpatch.JsonPointer(path).resolve(doc) == "x"


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"apiVersion": "admission.k8s.io/v1beta1", "request": {}}, "apiVersion"),
        ({"request": {"uid": "", "operation": "CREATE"}}, "request.uid"),
        ({"request": {"uid": "x", "operation": "PATCH"}}, "request.operation"),
        ({"request": {"uid": "x", "operation": "CREATE", "object": []}}, "request.object"),
        ({"request": {"uid": "u" * 129, "operation": "CREATE"}}, "request.uid"),
        ({"request": {"uid": "x", "operation": "CREATE", "name": "n" * 254}}, "request.name"),
        (
            {"request": {"uid": "x", "operation": "CREATE", "namespace": "n" * 64}},
            "request.namespace",
        ),
    ],
)
def test_malformed_reviews_name_the_field(raw: object, path: str) -> None:
    with pytest.raises(ContractError) as info:
        AdmissionRequest.from_review(raw)
    assert info.value.path == path


def test_allow_carries_warnings_only_when_there_are_some() -> None:
    response = admission_allow("u", (), ("look out",))["response"]
    assert response == {"uid": "u", "allowed": True, "warnings": ["look out"]}
    assert "warnings" not in admission_allow("u")["response"]
