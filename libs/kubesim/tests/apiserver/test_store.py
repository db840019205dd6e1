"""Object semantics of the store: identity, versions, validation, CAS, preconditions, binding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rgpu_kubesim import ApiError, Store
from rgpu_kubesim.apiserver.storage._storage import Storage

Loader = Callable[[str], Any]
Manifest = Callable[..., dict[str, Any]]


@pytest.fixture
def store() -> Store:
    return Store(Storage(seed=7, clock=lambda: 1_795_000_000.0))


def _error(call: Callable[[], object]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def test_system_namespaces_exist_and_carry_their_name_label(store: Store) -> None:
    names = [ns["metadata"]["name"] for ns in store.list("namespaces")]
    assert {"default", "kube-system"} <= set(names)
    assert store.get("namespaces", "default")["metadata"]["labels"] == {
        "kubernetes.io/metadata.name": "default"
    }


def test_create_sets_identity_version_timestamp_and_generation(store: Store, pod: Manifest) -> None:
    before = store.resource_version
    created = store.create("pods", pod("a"))
    meta = created["metadata"]
    assert created["kind"] == "Pod" and created["apiVersion"] == "v1"
    assert meta["resourceVersion"] == str(before + 1)
    assert len(meta["uid"]) == 36 and meta["generation"] == 1
    assert meta["creationTimestamp"] == "2026-11-18T11:06:40Z"
    assert created["status"]["phase"] == "Pending"
    assert created["spec"]["schedulerName"] == "default-scheduler"


def test_resource_versions_are_global_and_monotonic(
    store: Store, pod: Manifest, node: Manifest
) -> None:
    versions = [
        int(store.create("pods", pod("a"))["metadata"]["resourceVersion"]),
        int(store.create("nodes", node("n"))["metadata"]["resourceVersion"]),
        int(
            store.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}})["metadata"][
                "resourceVersion"
            ]
        ),
    ]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert store.resource_version == versions[-1]


def test_identities_are_deterministic_by_seed(pod: Manifest) -> None:
    def uid() -> str:
        return str(Store(Storage(seed=3)).create("pods", pod("a"))["metadata"]["uid"])

    assert uid() == uid()


def test_generate_name_appends_five_characters(store: Store, pod: Manifest) -> None:
    manifest = pod("", metadata={"generateName": "trainer-"})
    name = store.create("pods", manifest)["metadata"]["name"]
    assert name.startswith("trainer-") and len(name) == len("trainer-") + 5


def test_duplicate_create_is_already_exists(store: Store, pod: Manifest, fixture: Loader) -> None:
    store.create("pods", pod("trainer-0"))
    error = _error(lambda: store.create("pods", pod("trainer-0")))
    assert error.status == fixture("status-409-pod-alreadyexists.json")


def test_get_of_missing_object_is_not_found(store: Store, fixture: Loader) -> None:
    error = _error(lambda: store.get("pods", "trainer-0", namespace="ml-team"))
    assert error.status == fixture("status-404-pod-notfound.json")


def test_create_in_missing_namespace_is_namespace_not_found(store: Store, pod: Manifest) -> None:
    error = _error(lambda: store.create("pods", pod("a", namespace="nowhere")))
    assert error.code == 404
    assert error.status["message"] == 'namespaces "nowhere" not found'
    assert error.status["details"] == {"name": "nowhere", "kind": "namespaces"}


def test_delete_in_missing_namespace_is_not_found(store: Store) -> None:
    assert _error(lambda: store.delete("pods", "a", namespace="nowhere")).code == 404


def test_cluster_scoped_objects_ignore_namespace(store: Store, node: Manifest) -> None:
    created = store.create("nodes", node("gpu-a"), namespace="ignored")
    assert "namespace" not in created["metadata"]
    assert store.get("nodes", "gpu-a")["metadata"]["name"] == "gpu-a"


def test_unknown_resource_names_the_served_ones(store: Store) -> None:
    error = _error(lambda: store.list("deployments"))
    assert error.code == 404 and "leases" in error.status["message"]


def test_returned_objects_are_copies(store: Store, pod: Manifest) -> None:
    created = store.create("pods", pod("a"))
    created["metadata"]["labels"] = {"mutated": "yes"}
    assert "labels" not in store.get("pods", "a")["metadata"]


def test_list_filters_by_namespace_and_selectors(store: Store, pod: Manifest) -> None:
    store.create("namespaces", {"metadata": {"name": "ml"}})
    store.create("pods", pod("a", metadata={"labels": {"app": "x"}}))
    store.create("pods", pod("b", namespace="ml", metadata={"labels": {"app": "y"}}))
    store.bind("b", "gpu-a", namespace="ml")
    assert [p["metadata"]["name"] for p in store.list("pods")] == ["a", "b"]
    assert [p["metadata"]["name"] for p in store.list("pods", namespace="ml")] == ["b"]
    assert [p["metadata"]["name"] for p in store.list("pods", label_selector="app!=y")] == ["a"]
    assert [p["metadata"]["name"] for p in store.list("pods", field_selector="spec.nodeName=")] == [
        "a"
    ]


def test_replace_with_stale_version_conflicts(store: Store, pod: Manifest, fixture: Loader) -> None:
    store.create("namespaces", {"metadata": {"name": "ml-team"}})
    created = store.create("pods", pod("trainer-0", namespace="ml-team"))
    store.patch("pods", "trainer-0", {"metadata": {"labels": {"a": "b"}}}, namespace="ml-team")
    error = _error(lambda: store.replace("pods", created))
    assert error.status == fixture("status-409-conflict-resourceversion.json")


def test_replace_without_version_is_unconditional_for_pods(store: Store, pod: Manifest) -> None:
    created = store.create("pods", pod("a"))
    del created["metadata"]["resourceVersion"]
    created["metadata"]["labels"] = {"x": "y"}
    assert store.replace("pods", created)["metadata"]["labels"] == {"x": "y"}


def test_lease_update_without_version_is_invalid(
    store: Store, lease: Manifest, fixture: Loader
) -> None:
    store.create("leases", lease("rgpu-scheduler", namespace="kube-system"))
    error = _error(
        lambda: store.replace("leases", lease("rgpu-scheduler", namespace="kube-system"))
    )
    assert error.status == fixture("status-422-lease-update-without-resourceversion.json")


def test_lease_compare_and_swap_lets_exactly_one_writer_win(store: Store, lease: Manifest) -> None:
    current = store.create("leases", lease("l"))
    first, second = (
        dict(current, spec={"holderIdentity": "x"}),
        dict(current, spec={"holderIdentity": "y"}),
    )
    store.replace("leases", first)
    assert _error(lambda: store.replace("leases", second)).code == 409
    assert store.get("leases", "l")["spec"]["holderIdentity"] == "x"


def test_noop_update_keeps_the_resource_version(store: Store, pod: Manifest) -> None:
    created = store.create("pods", pod("a", metadata={"labels": {"x": "1"}}))
    again = store.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}})
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_generation_increments_only_on_spec_changes(store: Store, lease: Manifest) -> None:
    store.create("leases", lease("l"))
    labelled = store.patch("leases", "l", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    changed = store.patch("leases", "l", {"spec": {"holderIdentity": "z"}})
    assert changed["metadata"]["generation"] == 2


def test_main_resource_update_keeps_pod_status(store: Store, pod: Manifest) -> None:
    created = store.create("pods", pod("a"))
    store.patch("pods", "a", {"status": {"phase": "Running"}}, subresource="status")
    created["metadata"].pop("resourceVersion")
    created["status"] = {"phase": "Failed"}
    assert store.replace("pods", created)["status"]["phase"] == "Running"


def test_status_update_changes_status_and_metadata_but_not_spec(
    store: Store, pod: Manifest
) -> None:
    store.create("pods", pod("a"))
    patch = {
        "metadata": {"labels": {"x": "y"}},
        "spec": {"nodeName": "n"},
        "status": {"phase": "Running"},
    }
    updated = store.patch("pods", "a", patch, subresource="status")
    assert updated["status"]["phase"] == "Running" and updated["metadata"]["labels"] == {"x": "y"}
    assert "nodeName" not in updated["spec"]


def test_pod_spec_is_immutable_apart_from_images(store: Store, pod: Manifest) -> None:
    store.create("pods", pod("a"))
    error = _error(lambda: store.patch("pods", "a", {"spec": {"nodeName": "n"}}))
    assert error.code == 422 and "pod updates may not change fields" in error.status["message"]
    image = [{"name": "main", "image": "busybox:1.37"}]
    assert store.patch("pods", "a", {"spec": {"containers": image}}, patch_type="strategic")


def test_extended_resource_request_must_equal_limit(store: Store, fixture: Loader) -> None:
    review = fixture("admission-review-pod-create.json")["request"]["object"]
    review["metadata"].pop("managedFields")
    review["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/remote-gpu"] = "2"
    store.create("namespaces", {"metadata": {"name": "ml-team"}})
    error = _error(lambda: store.create("pods", review))
    assert error.status == fixture("status-422-pod-invalid-extended-resource.json")


@pytest.mark.parametrize("quantity", ["1500m", "0.5"])
def test_extended_resource_must_be_an_integer(store: Store, pod: Manifest, quantity: str) -> None:
    manifest = pod("a")
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/remote-gpu": quantity}}
    error = _error(lambda: store.create("pods", manifest))
    assert error.code == 422 and "must be an integer" in error.status["message"]


def test_limits_default_the_requests(store: Store, pod: Manifest) -> None:
    manifest = pod("a")
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/remote-gpu": "2"}}
    created = store.create("pods", manifest)
    assert created["spec"]["containers"][0]["resources"]["requests"] == {
        "nvidia.com/remote-gpu": "2"
    }


def test_native_resources_may_differ_between_request_and_limit(store: Store, pod: Manifest) -> None:
    manifest = pod("a")
    resources = {
        "limits": {"cpu": "2", "memory": "2Gi"},
        "requests": {"cpu": "500m", "memory": "1Gi"},
    }
    manifest["spec"]["containers"][0]["resources"] = resources
    assert store.create("pods", manifest)["status"]["qosClass"] == "Burstable"


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"metadata": {"name": "Bad_Name"}}, "a lowercase RFC 1123 subdomain"),
        ({"metadata": {"name": ""}}, "name or generateName is required"),
        ({"spec": {"containers": []}}, "spec.containers: Required value"),
        ({"spec": {"containers": [{"name": "main"}]}}, "spec.containers[0].image: Required value"),
        ({"metadata": {"name": "a", "labels": {"bad key": "x"}}}, "metadata.labels"),
    ],
)
def test_invalid_pods_are_rejected_with_the_field(
    store: Store, pod: Manifest, change: dict[str, Any], fragment: str
) -> None:
    manifest = pod("a")
    for key, value in change.items():
        manifest[key] = {**manifest[key], **value}
    error = _error(lambda: store.create("pods", manifest))
    assert error.code == 422 and fragment in error.status["message"]
    assert error.status["details"]["kind"] == "Pod"


def test_namespace_mismatch_between_body_and_request_is_a_400(store: Store, pod: Manifest) -> None:
    error = _error(
        lambda: store.create("pods", pod("a", namespace="kube-system"), namespace="default")
    )
    assert error.code == 400 and "does not match the namespace" in error.status["message"]


def test_wrong_kind_in_body_is_a_400(store: Store, node: Manifest) -> None:
    assert _error(lambda: store.create("pods", node("n"))).code == 400


def test_delete_returns_the_object_with_a_new_version(store: Store, pod: Manifest) -> None:
    created = store.create("pods", pod("a"))
    deleted = store.delete("pods", "a")
    assert int(deleted["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert _error(lambda: store.get("pods", "a")).code == 404


def test_delete_precondition_on_uid_conflicts(store: Store, pod: Manifest, fixture: Loader) -> None:
    store.create("namespaces", {"metadata": {"name": "ml-team"}})
    store.create("pods", pod("trainer-0", namespace="ml-team"))
    wrong = {"uid": "00000000-0000-0000-0000-000000000000"}
    error = _error(
        lambda: store.delete("pods", "trainer-0", namespace="ml-team", preconditions=wrong)
    )
    expected = fixture("status-409-delete-precondition-uid.json")
    actual_uid = store.get("pods", "trainer-0", namespace="ml-team")["metadata"]["uid"]
    expected["message"] = expected["message"].replace(
        "8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f", actual_uid
    )
    assert error.status == expected


def test_delete_precondition_on_resource_version_conflicts(store: Store, pod: Manifest) -> None:
    store.create("pods", pod("a"))
    error = _error(lambda: store.delete("pods", "a", preconditions={"resourceVersion": "1"}))
    assert error.code == 409 and "ResourceVersion in precondition: 1" in error.status["message"]


def test_deleting_a_namespace_deletes_its_objects(
    store: Store, pod: Manifest, lease: Manifest
) -> None:
    store.create("namespaces", {"metadata": {"name": "ml"}})
    store.create("pods", pod("a", namespace="ml"))
    store.create("leases", lease("l", namespace="ml"))
    store.delete("namespaces", "ml")
    assert store.list("pods", namespace="ml") == [] and store.list("leases", namespace="ml") == []


def test_a_deleted_namespace_terminates_until_the_controller_finalizes_it(
    pod: Manifest,
) -> None:
    storage = Storage(seed=7, clock=lambda: 1_795_000_000.0)
    store = Store(storage)
    store.create("namespaces", {"metadata": {"name": "ml"}})
    deleted = store.delete("namespaces", "ml")
    assert deleted["status"]["phase"] == "Terminating"
    assert deleted["metadata"]["deletionTimestamp"] == "2026-11-18T11:06:40Z"
    assert _error(lambda: store.create("pods", pod("a", namespace="ml"))).code == 403
    storage.finalize_namespaces()
    assert _error(lambda: store.get("namespaces", "ml")).code == 404


def test_system_namespaces_cannot_be_deleted(store: Store) -> None:
    assert _error(lambda: store.delete("namespaces", "default")).code == 403


def test_binding_sets_node_annotations_and_scheduled_condition(store: Store, pod: Manifest) -> None:
    uid = store.create("pods", pod("a"))["metadata"]["uid"]
    bound = store.bind(
        "a", "gpu-node-1", uid=uid, annotations={"hami.io/lupine-endpoint": "10.0.3.50:50051"}
    )
    assert bound["spec"]["nodeName"] == "gpu-node-1"
    assert bound["metadata"]["annotations"] == {"hami.io/lupine-endpoint": "10.0.3.50:50051"}
    assert [c["type"] for c in bound["status"]["conditions"]] == ["PodScheduled"]


def test_binding_twice_is_already_assigned(store: Store, pod: Manifest, fixture: Loader) -> None:
    store.create("namespaces", {"metadata": {"name": "ml-team"}})
    store.create("pods", pod("trainer-0", namespace="ml-team"))
    store.bind("trainer-0", "gpu-node-2", namespace="ml-team")
    error = _error(lambda: store.bind("trainer-0", "gpu-node-1", namespace="ml-team"))
    assert error.status == fixture("status-409-binding-already-assigned.json")


def test_binding_with_wrong_uid_conflicts(store: Store, pod: Manifest) -> None:
    store.create("pods", pod("a"))
    error = _error(lambda: store.bind("a", "n", uid="00000000-0000-0000-0000-000000000000"))
    assert error.code == 409 and "UID in precondition" in error.status["message"]


def test_unknown_patch_type_is_unsupported_media_type(store: Store, pod: Manifest) -> None:
    store.create("pods", pod("a"))
    assert _error(lambda: store.patch("pods", "a", {}, patch_type="apply")).code == 415


def test_merge_patch_with_stale_resource_version_conflicts(store: Store, pod: Manifest) -> None:
    store.create("pods", pod("a"))
    stale = {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}}
    assert _error(lambda: store.patch("pods", "a", stale)).code == 409


def test_failed_json_patch_test_is_invalid(store: Store, pod: Manifest) -> None:
    store.create("pods", pod("a"))
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}]
    error = _error(lambda: store.patch("pods", "a", ops, patch_type="json"))
    assert error.code == 422 and error.status["reason"] == "Invalid"
    assert error.status["details"]["causes"][0]["reason"] == "UnexpectedServerResponse"


def test_webhook_configuration_is_defaulted_and_validated(store: Store) -> None:
    config = {
        "metadata": {"name": "w"},
        "webhooks": [
            {
                "name": "pods.remote-gpu.hami.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "clientConfig": {"service": {"namespace": "ns", "name": "svc"}},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
            }
        ],
    }
    stored = store.create("mutatingwebhookconfigurations", config)["webhooks"][0]
    assert stored["failurePolicy"] == "Fail" and stored["timeoutSeconds"] == 10
    assert stored["clientConfig"]["service"]["port"] == 443 and stored["rules"][0]["scope"] == "*"
    config["metadata"]["name"] = "w2"
    config["webhooks"][0]["clientConfig"] = {"url": "http://insecure"}
    error = _error(lambda: store.create("mutatingwebhookconfigurations", config))
    assert error.code == 422 and "'https' is the only allowed URL scheme" in error.status["message"]
