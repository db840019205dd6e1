"""The REST surface over real HTTP: Status bodies, lists, writes, patches, binding, discovery."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from rgpu_kubesim import SimApiServer

pytestmark = pytest.mark.anyio

Loader = Callable[[str], Any]
Manifest = Callable[..., dict[str, Any]]
PODS = "/api/v1/namespaces/default/pods"
ML_PODS = "/api/v1/namespaces/ml-team/pods"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


@pytest.fixture
async def ml_team(sim: SimApiServer) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "ml-team"}})


def _patch(client: httpx.AsyncClient, path: str, body: Any, kind: str) -> Any:
    return client.patch(path, content=orjson.dumps(body), headers={"Content-Type": kind})


async def test_get_missing_pod_returns_the_not_found_status(
    client: httpx.AsyncClient, ml_team: None, fixture: Loader
) -> None:
    response = await client.get(f"{ML_PODS}/trainer-0")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    assert response.json() == fixture("status-404-pod-notfound.json")


async def test_create_returns_201_and_duplicate_returns_already_exists(
    client: httpx.AsyncClient, ml_team: None, pod: Manifest, fixture: Loader
) -> None:
    created = await client.post(ML_PODS, json=pod("trainer-0", namespace="ml-team"))
    assert created.status_code == 201 and created.json()["kind"] == "Pod"
    again = await client.post(ML_PODS, json=pod("trainer-0", namespace="ml-team"))
    assert again.status_code == 409
    assert again.json() == fixture("status-409-pod-alreadyexists.json")


async def test_create_accepts_yaml_bodies(client: httpx.AsyncClient) -> None:
    body = "kind: Pod\nmetadata: {name: y}\nspec: {containers: [{name: m, image: x:1}]}"
    response = await client.post(PODS, content=body, headers={"Content-Type": "application/yaml"})
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("GET", "/api/v1/deployments", 404),
        ("GET", "/apis/apps/v1/namespaces/default/deployments", 404),
        ("GET", "/api/v1/namespaces/default/nodes/x", 404),
        ("GET", "/api/v1/namespaces/default/pods/x/exec", 404),
        ("PUT", "/api/v1/pods", 405),
        ("POST", "/api/v1/pods", 405),
        ("POST", "/api/v1/namespaces/default/pods/x", 405),
        ("GET", "/api/v1/namespaces/default/pods/x/binding", 405),
    ],
)
async def test_unserved_paths_and_methods_get_kube_status(
    client: httpx.AsyncClient, method: str, path: str, code: int
) -> None:
    response = await client.request(method, path)
    assert response.status_code == code
    assert response.json()["kind"] == "Status" and response.json()["code"] == code


async def test_bad_field_selector_returns_kubes_400(
    client: httpx.AsyncClient, fixture: Loader
) -> None:
    response = await client.get("/api/v1/pods", params={"fieldSelector": "spec.schedulerNam=x"})
    assert response.status_code == 400
    assert response.json() == fixture("status-400-field-selector.json")


async def test_list_items_are_shaped_like_kube(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest, fixture: Loader
) -> None:
    sim.store.create("pods", pod("a"))
    body = (await client.get("/api/v1/pods")).json()
    reference = fixture("pod-list-rv0.json")
    assert body.keys() == reference.keys() and body["kind"] == "PodList"
    assert body["metadata"] == {"resourceVersion": str(sim.store.resource_version)}
    assert body["items"][0].keys() == reference["items"][0].keys()


async def test_list_pages_with_limit_and_continue(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    for index in range(5):
        sim.store.create("pods", pod(f"p{index}"))
    first = (await client.get(PODS, params={"limit": 2})).json()
    assert [p["metadata"]["name"] for p in first["items"]] == ["p0", "p1"]
    assert first["metadata"]["remainingItemCount"] == 3
    names = [p["metadata"]["name"] for p in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = (await client.get(PODS, params={"limit": 2, "continue": token})).json()
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        names += [p["metadata"]["name"] for p in page["items"]]
        token = page["metadata"].get("continue")
    assert names == [f"p{i}" for i in range(5)]


async def test_continue_token_older_than_the_window_is_expired(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    for index in range(3):
        sim.store.create("pods", pod(f"p{index}"))
    token = (await client.get(PODS, params={"limit": 1})).json()["metadata"]["continue"]
    sim.store.create("pods", pod("late"))
    sim.faults.expire_before()
    response = await client.get(PODS, params={"limit": 1, "continue": token})
    assert response.status_code == 410 and response.json()["reason"] == "Expired"


async def test_list_with_future_resource_version_is_too_large(client: httpx.AsyncClient) -> None:
    response = await client.get(PODS, params={"resourceVersion": "999999"})
    assert response.status_code == 504
    assert response.json()["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


async def test_label_selector_over_http(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a", metadata={"labels": {"app": "x"}}))
    sim.store.create("pods", pod("b"))
    response = await client.get("/api/v1/pods", params={"labelSelector": "app notin (y)"})
    assert [p["metadata"]["name"] for p in response.json()["items"]] == ["a", "b"]


async def test_put_with_stale_version_conflicts(
    client: httpx.AsyncClient, ml_team: None, pod: Manifest, fixture: Loader
) -> None:
    created = (await client.post(ML_PODS, json=pod("trainer-0", namespace="ml-team"))).json()
    await _patch(
        client,
        f"{ML_PODS}/trainer-0",
        {"metadata": {"labels": {"a": "b"}}},
        "application/merge-patch+json",
    )
    response = await client.put(f"{ML_PODS}/trainer-0", json=created)
    assert response.status_code == 409
    assert response.json() == fixture("status-409-conflict-resourceversion.json")


async def test_put_of_lease_without_version_is_invalid(
    client: httpx.AsyncClient, lease: Manifest, fixture: Loader
) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    await client.post(path, json=lease("rgpu-scheduler", namespace="kube-system"))
    response = await client.put(
        f"{path}/rgpu-scheduler", json=lease("rgpu-scheduler", namespace="kube-system")
    )
    assert response.status_code == 422
    assert response.json() == fixture("status-422-lease-update-without-resourceversion.json")


@pytest.mark.parametrize("kind", ["merge_patch", "strategic_merge_patch"])
async def test_map_patches_set_and_delete_annotations(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest, fixture: Loader, kind: str
) -> None:
    example = fixture("patch-annotations-examples.json")[kind]
    sim.store.create("pods", pod("trainer-0"))
    path = f"{PODS}/trainer-0"
    added = await _patch(client, path, example["set"], example["content_type"])
    assert added.json()["metadata"]["annotations"] == {"hami.io/lupine-endpoint": "10.0.3.50:50051"}
    removed = await _patch(client, path, example["delete"], example["content_type"])
    assert (
        "annotations" not in removed.json()["metadata"]
        or not removed.json()["metadata"]["annotations"]
    )


async def test_conditional_merge_patch_conflicts_when_stale(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest, fixture: Loader
) -> None:
    example = fixture("patch-annotations-examples.json")["merge_patch"]
    sim.store.create("pods", pod("trainer-0"))
    response = await _patch(
        client, f"{PODS}/trainer-0", example["conditional_set"], example["content_type"]
    )
    assert response.status_code == 409 and response.json()["reason"] == "Conflict"


async def test_json_patch_applies_and_failed_test_is_422(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest, fixture: Loader
) -> None:
    example = fixture("patch-annotations-examples.json")["json_patch"]
    sim.store.create("pods", pod("trainer-0"))
    path = f"{PODS}/trainer-0"
    added = await _patch(
        client, path, example["set_when_annotations_missing"], example["content_type"]
    )
    assert added.json()["metadata"]["annotations"] == {"hami.io/lupine-endpoint": "10.0.3.50:50051"}
    stale = await _patch(client, path, example["conditional_set"], example["content_type"])
    assert stale.status_code == 422
    assert (
        stale.json()["message"] == "the server rejected our request due to an error in our request"
    )


async def test_unsupported_patch_type_is_415(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    response = await _patch(client, f"{PODS}/a", {"metadata": {}}, "application/json")
    assert response.status_code == 415 and response.json()["reason"] == "UnsupportedMediaType"


async def test_status_subresource_keeps_metadata_changes_as_kube_does_but_never_spec(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    owner = {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u-1"}
    sim.store.create("pods", pod("a", metadata={"ownerReferences": [owner]}))
    body = {
        "metadata": {"labels": {"x": "y"}, "annotations": {"a": "b"}, "ownerReferences": None},
        "spec": {"nodeName": "elsewhere", "priority": 7},
        "status": {"phase": "Running"},
    }
    response = await _patch(client, f"{PODS}/a/status", body, "application/merge-patch+json")
    assert response.status_code == 200, response.text
    stored = sim.store.get("pods", "a")
    assert response.json() == stored
    assert stored["status"]["phase"] == "Running"
    assert (stored["metadata"]["labels"], stored["metadata"]["annotations"]) == (
        {"x": "y"},
        {"a": "b"},
    )
    assert stored["metadata"]["ownerReferences"] == [owner]
    assert "nodeName" not in stored["spec"] and stored["spec"]["priority"] == 0


async def test_status_subresource_put_keeps_new_labels_and_the_stored_spec(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    current = sim.store.create("pods", pod("a"))
    current["metadata"]["labels"] = {"seen-by": "kubelet"}
    current["spec"]["restartPolicy"] = "Never"
    current["status"] = {"phase": "Running"}
    response = await client.put(f"{PODS}/a/status", json=current)
    assert response.status_code == 200, response.text
    stored = sim.store.get("pods", "a")
    assert stored["metadata"]["labels"] == {"seen-by": "kubelet"}
    assert stored["spec"]["restartPolicy"] == "Always"


async def test_delete_with_uid_precondition_conflicts(
    client: httpx.AsyncClient, ml_team: None, pod: Manifest, fixture: Loader
) -> None:
    uid = (await client.post(ML_PODS, json=pod("trainer-0", namespace="ml-team"))).json()[
        "metadata"
    ]["uid"]
    options = fixture("delete-options-preconditions.json")
    options["preconditions"] = {"uid": "00000000-0000-0000-0000-000000000000"}
    response = await client.request("DELETE", f"{ML_PODS}/trainer-0", json=options)
    expected = fixture("status-409-delete-precondition-uid.json")
    expected["message"] = expected["message"].replace("8f6a3c1e-5b2d-4c7a-9e1f-0a2b3c4d5e6f", uid)
    assert response.status_code == 409 and response.json() == expected


async def test_delete_returns_the_pod_but_a_status_for_leases(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest, lease: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    uid = sim.store.create("leases", lease("l"))["metadata"]["uid"]
    assert (await client.delete(f"{PODS}/a")).json()["kind"] == "Pod"
    status = (await client.delete(f"{LEASES}/l")).json()
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "l", "group": "coordination.k8s.io", "kind": "leases", "uid": uid},
    }


async def test_delete_collection_deletes_matching_objects(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a", metadata={"labels": {"x": "1"}}))
    sim.store.create("pods", pod("b"))
    response = await client.delete(PODS, params={"labelSelector": "x=1"})
    assert [p["metadata"]["name"] for p in response.json()["items"]] == ["a"]
    assert [p["metadata"]["name"] for p in sim.store.list("pods")] == ["b"]


async def test_binding_returns_201_status_and_rebinding_conflicts(
    client: httpx.AsyncClient, ml_team: None, pod: Manifest, fixture: Loader
) -> None:
    created = (await client.post(ML_PODS, json=pod("trainer-0", namespace="ml-team"))).json()
    binding = fixture("binding-request.json")
    binding["metadata"]["uid"] = created["metadata"]["uid"]
    response = await client.post(f"{ML_PODS}/trainer-0/binding", json=binding)
    assert response.status_code == 201 and response.json() == fixture("binding-response-201.json")
    pod_now = (await client.get(f"{ML_PODS}/trainer-0")).json()
    assert pod_now["spec"]["nodeName"] == "gpu-node-1"
    assert pod_now["metadata"]["annotations"] == {"hami.io/lupine-endpoint": "10.0.3.50:50051"}
    binding["target"]["name"] = "gpu-node-2"
    again = await client.post(f"{ML_PODS}/trainer-0/binding", json=binding)
    expected = fixture("status-409-binding-already-assigned.json")
    expected["message"] = expected["message"].replace("gpu-node-2", "gpu-node-1")
    assert again.status_code == 409 and again.json() == expected


async def test_binding_with_stale_uid_conflicts(
    client: httpx.AsyncClient, ml_team: None, pod: Manifest, fixture: Loader
) -> None:
    await client.post(ML_PODS, json=pod("trainer-0", namespace="ml-team"))
    response = await client.post(
        f"{ML_PODS}/trainer-0/binding", json=fixture("binding-request.json")
    )
    assert response.status_code == 409 and "UID in precondition" in response.json()["message"]


async def test_legacy_bindings_collection_binds_by_body_name(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    binding = {"metadata": {"name": "a"}, "target": {"kind": "Node", "name": "n1"}}
    response = await client.post("/api/v1/namespaces/default/bindings", json=binding)
    assert response.status_code == 201
    assert sim.store.get("pods", "a")["spec"]["nodeName"] == "n1"


async def test_binding_without_target_is_invalid(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    response = await client.post(f"{PODS}/a/binding", json={"metadata": {"name": "a"}})
    assert response.status_code == 422


async def test_binding_a_missing_pod_is_not_found(client: httpx.AsyncClient) -> None:
    binding = {"metadata": {"name": "ghost"}, "target": {"name": "n"}}
    assert (await client.post(f"{PODS}/ghost/binding", json=binding)).status_code == 404


async def test_discovery_lists_exactly_what_is_served(client: httpx.AsyncClient) -> None:
    assert (await client.get("/version")).json()["major"] == "1"
    assert (await client.get("/api")).json()["versions"] == ["v1"]
    core = {r["name"]: r for r in (await client.get("/api/v1")).json()["resources"]}
    assert {
        "pods",
        "pods/status",
        "pods/binding",
        "nodes",
        "namespaces",
        "events",
        "bindings",
    } <= set(core)
    assert core["pods"]["namespaced"] and not core["nodes"]["namespaced"]
    groups = {g["name"] for g in (await client.get("/apis")).json()["groups"]}
    assert groups == {
        "coordination.k8s.io",
        "admissionregistration.k8s.io",
        "authentication.k8s.io",
        "scheduling.k8s.io",
        "policy",
        "rbac.authorization.k8s.io",
        "authorization.k8s.io",
        "networking.k8s.io",
    }
    leases = (await client.get("/apis/coordination.k8s.io/v1")).json()
    assert [r["name"] for r in leases["resources"]] == ["leases"]
    assert (await client.get("/apis/apps/v1")).status_code == 404


async def test_openapi_advertises_server_side_field_validation(client: httpx.AsyncClient) -> None:
    root = (await client.get("/openapi/v3")).json()
    url = root["paths"]["api/v1"]["serverRelativeURL"]
    document = (await client.get(url)).json()
    patch = document["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert patch["parameters"][0]["name"] == "fieldValidation"


async def test_table_output_for_pods_and_nodes(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest, node: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    ready = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "nodeInfo": {"kubeletVersion": "v1.32.0"},
    }
    sim.store.create(
        "nodes", {**node("gpu-a", **{"node-role.kubernetes.io/worker": ""}), "status": ready}
    )
    pods = (await client.get(PODS, headers={"Accept": TABLE})).json()
    assert pods["kind"] == "Table" and [c["name"] for c in pods["columnDefinitions"]][:5] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    assert pods["rows"][0]["cells"][:4] == ["a", "0/1", "Pending", "0"]
    assert pods["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    nodes = (await client.get("/api/v1/nodes/gpu-a", headers={"Accept": TABLE})).json()
    assert nodes["rows"][0]["cells"][:3] == ["gpu-a", "Ready", "worker"]
    assert nodes["rows"][0]["cells"][4] == "v1.32.0"


async def test_health_endpoints(client: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/livez", "/readyz"):
        assert (await client.get(path)).text == "ok"


async def test_malformed_json_body_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        PODS, content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["kind"] == "Status"


async def test_unknown_body_media_type_is_415(client: httpx.AsyncClient) -> None:
    response = await client.post(PODS, content=b"x", headers={"Content-Type": "application/cbor"})
    assert response.status_code == 415
