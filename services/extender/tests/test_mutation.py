"""The CREATE mutation: every returned patch is applied with the jsonpatch library and the
resulting pod is checked, as the apiserver would apply it."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from rgpu_extender.admission import AdmissionPolicy, decide
from rgpu_extender.container_env import CACHE_FILE, LIB_FILE, LIB_SOURCE, LIB_VOLUME

SCHEDULER = "rgpu-scheduler"
ENDPOINT_PATH = "metadata.annotations['hami.io/lupine-endpoint']"
LIB_IMAGE = "registry.example.com/hami-core:2.5"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
NOT_A_SERVER = {"key": "hami.io/lupine-server", "operator": "DoesNotExist"}
ONLY_CLIENT_NODES = {"nodeSelectorTerms": [{"matchExpressions": [NOT_A_SERVER]}]}


def policy(build, **env: str) -> AdmissionPolicy:
    return AdmissionPolicy.from_settings(build.settings(**env))


def mutate(build, the_pod: dict[str, Any], **env: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (review response, patched pod)."""
    review = decide(build.review(the_pod), policy(build, **env)).review
    response = review["response"]
    assert isinstance(response, dict)
    assert response["allowed"] is True, response
    return response, build.patched(review, the_pod)


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def field_path(entry: dict[str, Any]) -> str:
    return str(entry["valueFrom"]["fieldRef"]["fieldPath"])


def test_shared_create_fixture_is_mutated_and_uid_echoed(build, load_fixture) -> None:
    review = load_fixture("k8s/admission-review-pod-create.json")
    the_pod = review["request"]["object"]
    decision = decide(review, policy(build))
    assert decision.review["response"]["uid"] == review["request"]["uid"]
    assert decision.review["apiVersion"] == "admission.k8s.io/v1"
    assert decision.review["kind"] == "AdmissionReview"
    patched = build.patched(decision.review, the_pod)
    assert patched["spec"]["schedulerName"] == SCHEDULER
    assert patched["metadata"]["annotations"] == {"hami.io/webhook-mutated": "true"}
    env = patched["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["LUPINE_SERVER", "LUPINE_WORKLOAD_ID"]
    assert field_path(env[0]) == ENDPOINT_PATH
    assert field_path(env[1]) == "metadata.uid"
    untouched = copy.deepcopy(the_pod)
    assert patched["spec"]["affinity"] == {"nodeAffinity": {REQUIRED: ONLY_CLIENT_NODES}}
    patched["spec"].pop("affinity")
    assert patched["spec"].pop("schedulingGates") == [{"name": "rgpu.io/admission"}]
    for key in ("schedulerName",):
        untouched["spec"].pop(key)
        patched["spec"].pop(key)
    patched["metadata"].pop("annotations")
    patched["spec"]["containers"][0].pop("env")
    untouched["spec"]["containers"][0].pop("env")
    assert patched == untouched


def test_pod_without_annotations_env_or_name_gets_both_created(build) -> None:
    the_pod = build.pod(build.container(count="1", wired=False), scheduler=None)
    del the_pod["metadata"]["name"]
    the_pod["metadata"]["generateName"] = "trainer-"
    _, patched = mutate(build, the_pod)
    assert patched["metadata"]["annotations"] == {"hami.io/webhook-mutated": "true"}
    assert patched["spec"]["schedulerName"] == SCHEDULER
    assert set(env_of(patched["spec"]["containers"][0])) == {"LUPINE_SERVER", "LUPINE_WORKLOAD_ID"}


def test_existing_annotation_keys_are_escaped_in_the_pointer(build) -> None:
    the_pod = build.pod(build.container(count="1"), annotations={"team/a~b": "x"})
    response, patched = mutate(build, the_pod)
    assert patched["metadata"]["annotations"] == {
        "team/a~b": "x",
        "hami.io/webhook-mutated": "true",
    }
    assert response["patchType"] == "JSONPatch"


def test_literal_endpoint_is_replaced_in_place_and_duplicates_dropped(build) -> None:
    env = [
        {"name": "A", "value": "1"},
        {"name": "LUPINE_SERVER", "value": "10.0.0.9:14833"},
        {"name": "B", "value": "$(LUPINE_SERVER)"},
        {"name": "LUPINE_SERVER", "value": "stale"},
    ]
    _, patched = mutate(build, build.pod(build.container(count="1", env=env)))
    names = [e["name"] for e in patched["spec"]["containers"][0]["env"]]
    assert names == ["A", "LUPINE_SERVER", "LUPINE_WORKLOAD_ID", "B"]
    assert field_path(env_of(patched["spec"]["containers"][0])["LUPINE_SERVER"]) == ENDPOINT_PATH


def test_literal_workload_id_is_replaced_by_the_pod_uid(build) -> None:
    env = [{"name": "LUPINE_WORKLOAD_ID", "value": "mine"}]
    _, patched = mutate(build, build.pod(build.container(count="1", env=env)))
    assert field_path(env_of(patched["spec"]["containers"][0])["LUPINE_WORKLOAD_ID"]) == (
        "metadata.uid"
    )


def test_every_requesting_container_is_wired_init_included_and_others_left_alone(build) -> None:
    the_pod = build.pod(
        build.container("a", count="1", wired=False),
        build.container("web"),
        build.container("b", count="2", wired=False),
        init=[build.container("setup", count="1", wired=False), build.container("plain")],
    )
    _, patched = mutate(build, the_pod)
    spec = patched["spec"]
    assert "LUPINE_SERVER" in env_of(spec["initContainers"][0])
    assert "env" not in spec["initContainers"][1]
    assert "LUPINE_SERVER" in env_of(spec["containers"][0])
    assert "env" not in spec["containers"][1]
    assert "LUPINE_SERVER" in env_of(spec["containers"][2])


def test_card_mode_also_wires_visible_devices(build) -> None:
    _, patched = mutate(build, build.pod(build.container(count="1")), RGPU_GRANULARITY="card")
    entry = env_of(patched["spec"]["containers"][0])["CUDA_VISIBLE_DEVICES"]
    assert field_path(entry) == "metadata.annotations['rgpu.io/visible-devices']"


def test_server_mode_does_not_wire_visible_devices(build) -> None:
    _, patched = mutate(build, build.pod(build.container(count="1")))
    assert "CUDA_VISIBLE_DEVICES" not in env_of(patched["spec"]["containers"][0])


def test_hami_core_is_delivered_when_memory_is_requested(build) -> None:
    the_pod = build.pod(
        build.container(
            "main", count="1", memory="4000", env=[{"name": "LD_PRELOAD", "value": "/x.so"}]
        ),
        build.container("side", count="1"),
        init=[build.container("setup", count="1", memory="1000")],
    )
    _, patched = mutate(build, the_pod, RGPU_LIB_IMAGE=LIB_IMAGE)
    spec = patched["spec"]
    copier, setup = spec["initContainers"]
    assert copier["image"] == LIB_IMAGE
    assert copier["command"] == ["cp", "-f", LIB_SOURCE, LIB_FILE]
    assert copier["volumeMounts"] == [{"name": LIB_VOLUME, "mountPath": "/hami-remote-gpu"}]
    assert copier["resources"]["limits"] == {"cpu": "100m", "memory": "64Mi"}
    assert {"name": LIB_VOLUME, "emptyDir": {}} in spec["volumes"]
    main = env_of(spec["containers"][0])
    assert main["LD_PRELOAD"]["value"] == f"{LIB_FILE}:/x.so"
    assert main["CUDA_DEVICE_MEMORY_LIMIT"]["value"] == "4000m"
    assert main["CUDA_DEVICE_MEMORY_SHARED_CACHE"]["value"] == CACHE_FILE
    assert env_of(setup)["CUDA_DEVICE_MEMORY_LIMIT"]["value"] == "1000m"
    assert {"name": LIB_VOLUME, "mountPath": "/hami-remote-gpu"} in setup["volumeMounts"]
    assert "LD_PRELOAD" not in env_of(spec["containers"][1])
    assert "volumeMounts" not in spec["containers"][1]


def test_hami_core_extends_existing_volumes_and_init_containers(build) -> None:
    the_pod = build.pod(
        build.container(
            "main", count="1", memory="4000", volumeMounts=[{"name": "data", "mountPath": "/d"}]
        ),
        init=[build.container("first")],
        volumes=[{"name": "data", "emptyDir": {}}],
    )
    _, patched = mutate(build, the_pod, RGPU_LIB_IMAGE=LIB_IMAGE)
    spec = patched["spec"]
    assert [c["name"] for c in spec["initContainers"]] == [LIB_VOLUME, "first"]
    assert [v["name"] for v in spec["volumes"]] == ["data", LIB_VOLUME]
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["data", LIB_VOLUME]
    assert env_of(spec["containers"][0])["LD_PRELOAD"]["value"] == LIB_FILE


def test_hami_core_is_not_delivered_without_a_memory_request(build) -> None:
    _, patched = mutate(build, build.pod(build.container(count="1")), RGPU_LIB_IMAGE=LIB_IMAGE)
    assert "initContainers" not in patched["spec"]
    assert "LD_PRELOAD" not in env_of(patched["spec"]["containers"][0])


def test_hami_core_is_not_delivered_without_a_library_image(build) -> None:
    _, patched = mutate(build, build.pod(build.container(count="1", memory="4000")))
    assert "initContainers" not in patched["spec"]
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in env_of(patched["spec"]["containers"][0])


def test_sourced_ld_preload_is_refused_with_a_fix(build) -> None:
    env = [{"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    the_pod = build.pod(build.container("main", count="1", memory="4000", env=env))
    decision = decide(build.review(the_pod), policy(build, RGPU_LIB_IMAGE=LIB_IMAGE))
    status = decision.review["response"]["status"]
    assert decision.review["response"]["allowed"] is False
    assert status["code"] == 403
    assert 'container "main" sets LD_PRELOAD from valueFrom' in status["message"]
    assert "literal value" in status["message"]


@pytest.mark.parametrize(
    "env", [{}, {"RGPU_LIB_IMAGE": LIB_IMAGE}, {"RGPU_GRANULARITY": "card"}], ids=str
)
def test_mutating_a_mutated_pod_changes_nothing(build, env: dict[str, str]) -> None:
    the_pod = build.pod(
        build.container(
            "main", count="1", memory="4000", env=[{"name": "LD_PRELOAD", "value": "/x.so"}]
        ),
        init=[build.container("setup", count="1", wired=False)],
        scheduler=None,
    )
    _, once = mutate(build, the_pod, **env)
    response, twice = mutate(build, once, **env)
    assert "patch" not in response
    assert twice == once


@pytest.mark.parametrize(
    "env", [{}, {"RGPU_LIB_IMAGE": LIB_IMAGE}, {"RGPU_GRANULARITY": "card"}], ids=str
)
def test_mutated_pods_are_valid_kubernetes_pods(build, load_fixture, env: dict[str, str]) -> None:
    review = load_fixture("k8s/admission-review-pod-create.json")
    the_pod = review["request"]["object"]
    the_pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/remote-gpu-memory"] = "4000"
    the_pod["spec"]["initContainers"] = [
        build.container("warm", count="1", memory="1000", wired=False, env=None)
    ]
    decision = decide(build.review(the_pod), policy(build, **env))
    patched = build.patched(decision.review, the_pod)
    kubernetes_validate.validate(patched, kubernetes_validate.latest_version(), strict=True)
