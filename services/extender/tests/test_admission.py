"""The webhook's decisions: CREATE denials, the UPDATE guard on scheduler-owned annotations,
and everything the webhook must let through untouched."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rgpu_extender.admission import AdmissionPolicy, Decision, decide
from rgpu_extender.errors import MalformedReview

UID = "d2b7f0a4-9c3e-4f1b-8a6d-5e4c3b2a1f09"
ENDPOINT = "hami.io/lupine-endpoint"
V1 = "admission.k8s.io/v1"


def decide_with(build, review: dict[str, Any], **env: str) -> Decision:
    return decide(review, AdmissionPolicy.from_settings(build.settings(**env)))


def denial(decision: Decision) -> str:
    response = decision.review["response"]
    assert isinstance(response, dict)
    assert response["allowed"] is False
    assert response["uid"] == UID
    assert response["status"]["code"] == 403
    assert "patch" not in response
    return str(response["status"]["message"])


@pytest.mark.parametrize(
    "key",
    [
        "hami.io/remote-gpu-devices-to-allocate",
        "hami.io/remote-gpu-devices-allocated",
        "hami.io/lupine-endpoint",
        "rgpu.io/visible-devices",
        "rgpu.io/anything",
    ],
)
def test_create_with_a_scheduler_owned_annotation_is_denied(build, key: str) -> None:
    the_pod = build.pod(annotations={key: "10.0.0.1:14833"})
    message = denial(decide_with(build, build.review(the_pod)))
    assert key in message
    assert "ml-team/trainer-0" in message
    assert "remove them" in message


def test_create_with_an_ordinary_hami_annotation_is_allowed(build) -> None:
    the_pod = build.pod(annotations={"hami.io/webhook-mutated": "true", "team": "ml"})
    assert decide_with(build, build.review(the_pod)).allowed


@pytest.mark.parametrize("value", ["1.5", "-1", "2Gi", "1e3", str(2**31)])
def test_create_with_an_invalid_quantity_is_denied_naming_container_and_value(
    build, value: str
) -> None:
    the_pod = build.pod(build.container("trainer", count=value))
    message = denial(decide_with(build, build.review(the_pod)))
    assert f"nvidia.com/remote-gpu={value!r}" in message
    assert 'container "trainer"' in message


def test_create_with_an_invalid_quantity_in_an_init_container_is_denied(build) -> None:
    the_pod = build.pod(build.container("web"), init=[build.container("warm", count="x")])
    assert 'container "warm"' in denial(decide_with(build, build.review(the_pod)))


def test_create_with_memory_but_no_count_is_denied(build) -> None:
    the_pod = build.pod(build.container("main", memory="4000"))
    assert "but not for nvidia.com/remote-gpu" in denial(decide_with(build, build.review(the_pod)))


def test_create_with_a_preset_node_name_is_denied(build) -> None:
    the_pod = build.pod(nodeName="gpu-node-1")
    message = denial(decide_with(build, build.review(the_pod)))
    assert "spec.nodeName='gpu-node-1'" in message
    assert "nodeSelector" in message


def test_create_naming_another_scheduler_is_denied(build) -> None:
    the_pod = build.pod(scheduler="volcano")
    message = denial(decide_with(build, build.review(the_pod)))
    assert "'volcano'" in message
    assert "'rgpu-scheduler'" in message


def test_configured_scheduler_name_is_the_one_set(build) -> None:
    the_pod = build.pod(scheduler="default-scheduler")
    review = decide_with(build, build.review(the_pod), RGPU_SCHEDULER_NAME="gpu-sched").review
    assert build.patched(review, the_pod)["spec"]["schedulerName"] == "gpu-sched"


def test_denial_of_a_generate_name_pod_names_the_prefix(build) -> None:
    the_pod = build.pod(nodeName="n1")
    the_pod["metadata"]["name"] = ""
    the_pod["metadata"]["generateName"] = "job-"
    assert "pod ml-team/job-*" in denial(decide_with(build, build.review(the_pod)))


def test_pod_not_asking_for_the_resource_is_allowed_unchanged(build) -> None:
    the_pod = build.pod(build.container("web"), scheduler="other", nodeName="n1")
    decision = decide_with(build, build.review(the_pod))
    assert decision.review["response"] == {"uid": UID, "allowed": True}
    assert decision.outcome == "unchanged"


def test_custom_resource_name_is_honoured(build) -> None:
    the_pod = build.pod(build.container("main", count="1", wired=False))
    decision = decide_with(build, build.review(the_pod), RGPU_RESOURCE_COUNT="example.com/gpu")
    response = decision.review["response"]
    assert (response["allowed"], "patch" in response) == (True, False)
    # The default name is now only a look-alike of the configured one: worth a warning.
    (warning,) = response["warnings"]
    assert "did you mean example.com/gpu?" in warning


def updated(old: dict[str, Any], changes: dict[str, str | None]) -> dict[str, Any]:
    new = copy.deepcopy(old)
    current = new["metadata"].setdefault("annotations", {})
    for key, value in changes.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    return new


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({}, {ENDPOINT: "10.9.9.9:1"}),
        ({ENDPOINT: "10.0.0.1:1"}, {ENDPOINT: "10.9.9.9:1"}),
        ({ENDPOINT: "10.0.0.1:1"}, {ENDPOINT: None}),
        ({}, {"rgpu.io/retry-at": "1"}),
    ],
    ids=["add", "change", "remove", "rgpu-prefix"],
)
def test_update_of_an_owned_annotation_by_an_untrusted_user_is_denied(
    build, before: dict[str, str], after: dict[str, str | None]
) -> None:
    old = build.pod(annotations=before)
    review = build.review(updated(old, after), operation="UPDATE", old=old, user="alice")
    message = denial(decide_with(build, review))
    assert "user 'alice' may not add, change or remove" in message
    assert "RGPU_TRUSTED_USERS" in message


def test_update_of_an_owned_annotation_by_a_trusted_user_is_allowed(build) -> None:
    old = build.pod(annotations={})
    new = updated(old, {ENDPOINT: "10.9.9.9:1"})
    review = build.review(new, operation="UPDATE", old=old, user="ops-bot")
    decision = decide_with(build, review, RGPU_TRUSTED_USERS="admin,ops-bot")
    assert decision.review["response"] == {"uid": UID, "allowed": True}


def test_update_by_a_listed_rgpu_service_account_is_allowed(build) -> None:
    old = build.pod(annotations={})
    new = updated(old, {"rgpu.io/retry-at": "2"})
    user = "system:serviceaccount:rgpu-system:rgpu-allocator"
    review = build.review(new, operation="UPDATE", old=old, user=user)
    assert decide_with(build, review, RGPU_TRUSTED_USERS=user).allowed


def test_update_by_an_unlisted_account_of_rgpus_own_namespace_is_denied(build) -> None:
    old = build.pod(annotations={})
    new = updated(old, {"rgpu.io/retry-at": "2"})
    user = "system:serviceaccount:rgpu-system:default"
    listed = "system:serviceaccount:rgpu-system:rgpu-allocator"
    review = build.review(new, operation="UPDATE", old=old, user=user)
    assert "rgpu-system:default" in denial(decide_with(build, review, RGPU_TRUSTED_USERS=listed))


def test_update_by_a_service_account_of_another_namespace_is_denied(build) -> None:
    old = build.pod(annotations={})
    new = updated(old, {"rgpu.io/retry-at": "2"})
    user = "system:serviceaccount:ml-team:rgpu-allocator"
    denial(decide_with(build, build.review(new, operation="UPDATE", old=old, user=user)))


def test_update_leaving_owned_annotations_alone_is_allowed(build) -> None:
    old = build.pod(annotations={ENDPOINT: "10.0.0.1:1"})
    new = updated(old, {"team": "ml"})
    review = build.review(new, operation="UPDATE", old=old, user="alice")
    assert decide_with(build, review).review["response"] == {"uid": UID, "allowed": True}


def test_delete_is_allowed(build) -> None:
    review = build.review(None, operation="DELETE", old=build.pod())
    assert decide_with(build, review).outcome == "ignored"


def test_other_subresources_and_other_resources_are_ignored(build) -> None:
    binding = build.review({"kind": "Binding", "metadata": {"name": "x"}})
    binding["request"]["subResource"] = "binding"
    other = build.review({"metadata": {"name": "x"}})
    other["request"]["resource"]["resource"] = "configmaps"
    assert decide_with(build, binding).outcome == "ignored"
    assert decide_with(build, other).outcome == "ignored"


@pytest.mark.parametrize("subresource", ["status", "ephemeralcontainers", "resize"])
def test_owned_annotations_are_guarded_on_subresources_carrying_the_pod(
    build, subresource: str
) -> None:
    old = build.pod(annotations={})
    review = build.review(updated(old, {ENDPOINT: "10.6.6.6:1"}), operation="UPDATE", old=old)
    review["request"]["subResource"] = subresource
    assert ENDPOINT in denial(decide_with(build, review))


def test_create_without_an_object_is_denied_not_crashed(build) -> None:
    assert "carries no object" in denial(decide_with(build, build.review(None)))


@pytest.mark.parametrize(
    ("review", "fragment"),
    [
        ([], "expected a JSON object"),
        ({"apiVersion": "admission.k8s.io/v1beta1", "request": {}}, "admission.k8s.io/v1"),
        ({"apiVersion": V1}, "request"),
        ({"apiVersion": V1, "request": {"uid": ""}}, "uid"),
        ({"apiVersion": V1, "request": {"uid": "u", "operation": "X"}}, "operation"),
    ],
)
def test_malformed_review_raises_naming_the_field(build, review: object, fragment: str) -> None:
    with pytest.raises(MalformedReview, match=fragment):
        decide_with(build, review)  # type: ignore[arg-type]


def bad_request(decision: Decision) -> str:
    response = decision.review["response"]
    assert isinstance(response, dict)
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    return str(response["status"]["message"])


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        (("containers", 0, "env", 0, "name"), ["A"], "spec.containers[0].env[0].name"),
        (("containers", 0, "env"), 7, "spec.containers[0].env"),
        (("containers", 0, "env", 0), "A=1", "spec.containers[0].env[0]"),
        (("containers", 0, "resources"), [], "spec.containers[0].resources"),
        (("initContainers",), {}, "spec.initContainers"),
        (("nodeName",), 7, "spec.nodeName"),
    ],
)
def test_a_field_of_the_wrong_json_type_is_denied_with_400_naming_it(
    build, field: tuple[str | int, ...], value: object, path: str
) -> None:
    the_pod = build.pod(build.container(count="1", env=[{"name": "A", "value": "1"}]))
    parent: Any = the_pod["spec"]
    for step in field[:-1]:
        parent = parent[step]
    parent[field[-1]] = value
    message = bad_request(decide_with(build, build.review(the_pod)))
    assert message.startswith(f"{path}: expected")


def test_an_annotation_that_is_not_a_string_is_denied_naming_it(build) -> None:
    the_pod = build.pod(annotations={"team": ["ml"]})  # type: ignore[dict-item]
    message = bad_request(decide_with(build, build.review(the_pod)))
    assert "metadata.annotations['team']" in message


def test_a_pod_uid_past_kubernetes_limit_is_denied(build) -> None:
    the_pod = build.pod(uid="u" * 70_000)
    message = bad_request(decide_with(build, build.review(the_pod)))
    assert "metadata.uid: is 70000 characters" in message


def test_a_pod_asking_for_nothing_with_an_owned_annotation_is_denied_at_create(build) -> None:
    the_pod = build.pod(
        build.container("web"),
        annotations={"hami.io/remote-gpu-devices-allocated": "gpu-a/GPU-1,RemoteGPU,1,100:;"},
        nodeName="cpu-node-1",
    )
    message = denial(decide_with(build, build.review(the_pod)))
    assert "may not set annotation(s) hami.io/remote-gpu-devices-allocated" in message


def test_a_trusted_user_may_create_a_plain_pod_with_an_owned_annotation(build) -> None:
    the_pod = build.pod(build.container("web"), annotations={"rgpu.io/retry-at": "1"})
    review = build.review(the_pod, user="ops-bot")
    assert decide_with(build, review, RGPU_TRUSTED_USERS="ops-bot").allowed


def test_an_ephemeral_container_asking_for_the_resource_is_denied(build) -> None:
    debug = build.container("debug", count="1", wired=False)
    the_pod = build.pod(build.container("web"), ephemeralContainers=[debug])
    message = denial(decide_with(build, build.review(the_pod)))
    assert "spec.ephemeralContainers[0] asks for nvidia.com/remote-gpu" in message


TRACE = "rgpu.io/trace"
CREATION = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
WEBHOOK_SPAN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def traced(build, the_pod: dict[str, Any]) -> dict[str, Any]:
    """``the_pod`` as the webhook's CREATE mutation leaves it, its span being WEBHOOK_SPAN."""
    review = build.review(the_pod)
    decision = decide(
        review, AdmissionPolicy.from_settings(build.settings()), traceparent=WEBHOOK_SPAN
    )
    assert decision.allowed, decision.message
    return build.patched(decision.review, the_pod)


def test_the_webhook_records_its_span_on_a_gpu_pod_it_creates(build) -> None:
    patched = traced(build, build.pod())
    assert patched["metadata"]["annotations"][TRACE] == WEBHOOK_SPAN
    assert traced(build, patched) == patched


def test_a_pod_asking_for_nothing_gets_no_creation_recorded(build) -> None:
    plain = build.pod(build.container(count=None, memory=None))
    assert TRACE not in (traced(build, plain)["metadata"].get("annotations") or {})


def test_a_readable_creation_present_at_create_is_kept_not_refused(build) -> None:
    # The webhook's own, when the apiserver reinvokes it; a pod author's value only ever
    # becomes a span link, never a parent.
    patched = traced(build, build.pod(annotations={TRACE: CREATION}))
    assert patched["metadata"]["annotations"][TRACE] == CREATION


def test_an_unreadable_creation_at_create_is_replaced_by_the_webhooks(build) -> None:
    patched = traced(build, build.pod(annotations={TRACE: "not a traceparent"}))
    assert patched["metadata"]["annotations"][TRACE] == WEBHOOK_SPAN


def test_the_creation_may_not_be_changed_or_removed_by_an_untrusted_user(build) -> None:
    old = build.pod(annotations={TRACE: CREATION})
    for after in ({TRACE: WEBHOOK_SPAN}, {TRACE: None}):
        review = build.review(updated(old, after), operation="UPDATE", old=old, user="alice")
        assert TRACE in denial(decide_with(build, review))
