"""The webhook's side of admission by scheduling gate: new GPU pods get rgpu's gate (after any
other system's), and nobody but rgpu's trusted identities may lift it."""

from __future__ import annotations

import copy
from typing import Any

from rgpu_extender.admission import AdmissionPolicy, Decision, decide

GATE = {"name": "rgpu.io/admission"}
KUEUE = {"name": "kueue.x-k8s.io/admission"}


def decide_with(build, review: dict[str, Any], **env: str) -> Decision:
    return decide(review, AdmissionPolicy.from_settings(build.settings(**env)))


def created(build, the_pod: dict[str, Any], **env: str) -> dict[str, Any]:
    decision = decide_with(build, build.review(the_pod), **env)
    assert decision.allowed
    return build.patched(decision.review, the_pod)


def lifted(the_pod: dict[str, Any], *keep: dict[str, str]) -> dict[str, Any]:
    after = copy.deepcopy(the_pod)
    after["spec"]["schedulingGates"] = list(keep)
    return after


def test_a_new_gpu_pod_is_gated_by_default(build) -> None:
    assert created(build, build.pod())["spec"]["schedulingGates"] == [GATE]


def test_rgpus_gate_goes_after_the_gates_the_pod_already_has(build) -> None:
    the_pod = build.pod(schedulingGates=[KUEUE])
    assert created(build, the_pod)["spec"]["schedulingGates"] == [KUEUE, GATE]


def test_a_pod_already_carrying_rgpus_gate_gets_no_second_one(build) -> None:
    the_pod = build.pod(schedulingGates=[GATE])
    assert created(build, the_pod)["spec"]["schedulingGates"] == [GATE]


def test_a_pod_asking_for_no_gpu_is_not_gated(build) -> None:
    the_pod = build.pod(build.container())
    assert "schedulingGates" not in created(build, the_pod)["spec"]


def test_the_filter_flow_gates_nothing(build) -> None:
    patched = created(build, build.pod(), RGPU_ADMISSION="filter")
    assert "schedulingGates" not in patched["spec"]


def test_an_untrusted_user_lifting_rgpus_gate_is_denied_with_the_way_out(build) -> None:
    old = created(build, build.pod())
    review = build.review(lifted(old), operation="UPDATE", old=old, user="alice")
    decision = decide_with(build, review)
    assert not decision.allowed
    message = decision.review["response"]["status"]["message"]
    assert "alice" in message
    assert "rgpu.io/admission" in message
    assert "rgpu explain" in message


def test_a_trusted_identity_may_lift_rgpus_gate(build) -> None:
    old = created(build, build.pod())
    allocator = "system:serviceaccount:rgpu-system:rgpu-allocator"
    review = build.review(lifted(old), operation="UPDATE", old=old, user=allocator)
    assert decide_with(build, review, RGPU_TRUSTED_USERS=allocator).allowed


def test_anyone_may_lift_another_systems_gate_and_keep_rgpus(build) -> None:
    old = created(build, build.pod(schedulingGates=[KUEUE]))
    review = build.review(lifted(old, GATE), operation="UPDATE", old=old, user="kueue")
    assert decide_with(build, review).allowed


def test_updates_of_a_pod_that_was_never_gated_are_not_guarded(build) -> None:
    old = build.pod()
    after = copy.deepcopy(old)
    after["metadata"]["labels"] = {"team": "ml"}
    review = build.review(after, operation="UPDATE", old=old, user="alice")
    assert decide_with(build, review).allowed
