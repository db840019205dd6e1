"""RBAC as kube-apiserver authorizes it, over real HTTP: who is asking, which bindings reach
them, resourceNames and subresources, aggregated roles, and kube's exact 403."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from rgpu_kubesim import ApiOptions, SimApiServer, UserGrant, run_apiserver
from rgpu_testkit import binding_manifest

pytestmark = pytest.mark.anyio

RBAC = "/apis/rbac.authorization.k8s.io/v1"
PODS = "/api/v1/namespaces/default/pods"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
MERGE = {"Content-Type": "application/merge-patch+json"}


def as_user(name: str, *groups: str) -> dict[str, Any]:
    return {"X-Sim-User": name} | ({"X-Sim-Group": ",".join(groups)} if groups else {})


def role(name: str, *rules: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"metadata": meta, "rules": list(rules)}


def rule(verbs: str, group: str, *resources: str, names: tuple[str, ...] = ()) -> dict[str, Any]:
    body = {"apiGroups": [group], "resources": list(resources), "verbs": verbs.split(",")}
    return body | ({"resourceNames": list(names)} if names else {})


@pytest.fixture
def options() -> ApiOptions:
    return ApiOptions(user_grant=None)


@pytest.fixture
async def admin(sim: SimApiServer) -> AsyncIterator[httpx.AsyncClient]:
    """The plain port without a user: cluster admin, as through ``kubectl proxy``."""
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        yield client


async def test_a_request_naming_no_user_is_the_cluster_admin(admin: httpx.AsyncClient) -> None:
    created = await admin.post(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        json={"metadata": {"name": "urgent"}, "value": 1000},
    )
    assert created.status_code == 201, created.text


async def test_a_named_user_without_a_binding_is_refused_with_kubes_message(
    admin: httpx.AsyncClient, pod: Any
) -> None:
    listed = await admin.get(PODS, headers=as_user("alice"))
    assert listed.status_code == 403
    assert listed.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods is forbidden: User "alice" cannot list resource "pods" in API group "" '
        'in the namespace "default"',
        "reason": "Forbidden",
        "details": {"kind": "pods"},
        "code": 403,
    }
    named = await admin.get(f"{LEASES}/holder", headers=as_user("alice"))
    assert named.json()["message"] == (
        'leases.coordination.k8s.io "holder" is forbidden: User "alice" cannot get resource '
        '"leases" in API group "coordination.k8s.io" in the namespace "default"'
    )
    assert named.json()["details"] == {
        "name": "holder",
        "group": "coordination.k8s.io",
        "kind": "leases",
    }
    cluster = await admin.post(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        json={"metadata": {"name": "x"}, "value": 1},
        headers=as_user("alice"),
    )
    assert cluster.json()["message"] == (
        'priorityclasses.scheduling.k8s.io is forbidden: User "alice" cannot create resource '
        '"priorityclasses" in API group "scheduling.k8s.io" at the cluster scope'
    )


async def test_a_role_bound_in_a_namespace_grants_there_only(admin: httpx.AsyncClient) -> None:
    await admin.post("/api/v1/namespaces", json={"metadata": {"name": "team"}})
    reader = role("pod-reader", rule("get,list,watch", "", "pods"), namespace="default")
    assert (await admin.post(f"{RBAC}/namespaces/default/roles", json=reader)).status_code == 201
    binding = binding_manifest("alice-reads", role="pod-reader", user="alice", role_kind="Role")
    await admin.post(f"{RBAC}/namespaces/default/rolebindings", json=binding)
    assert (await admin.get(PODS, headers=as_user("alice"))).status_code == 200
    other = await admin.get("/api/v1/namespaces/team/pods", headers=as_user("alice"))
    assert other.status_code == 403
    everywhere = await admin.get("/api/v1/pods", headers=as_user("alice"))
    assert everywhere.status_code == 403
    assert "at the cluster scope" in everywhere.json()["message"]
    write = await admin.post(PODS, json={"metadata": {"name": "p"}}, headers=as_user("alice"))
    assert write.status_code == 403


async def test_a_cluster_role_binding_to_a_group_grants_every_member_everywhere(
    admin: httpx.AsyncClient,
) -> None:
    await admin.post(f"{RBAC}/clusterroles", json=role("node-reader", rule("list", "", "nodes")))
    binding = binding_manifest("readers", role="node-reader", user="unused")
    binding["subjects"] = [{"kind": "Group", "name": "ops"}]
    assert (await admin.post(f"{RBAC}/clusterrolebindings", json=binding)).status_code == 201
    assert (await admin.get("/api/v1/nodes", headers=as_user("bob", "ops"))).status_code == 200
    assert (await admin.get("/api/v1/nodes", headers=as_user("bob"))).status_code == 403


async def test_a_service_account_subject_binds_the_account_and_its_groups(
    admin: httpx.AsyncClient,
) -> None:
    reader = role("pod-reader", rule("list", "", "pods"), namespace="default")
    await admin.post(f"{RBAC}/namespaces/default/roles", json=reader)
    # A ServiceAccount subject without a namespace is the binding's namespace's.
    binding = {
        "metadata": {"name": "robots"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "robot"}],
    }
    await admin.post(f"{RBAC}/namespaces/default/rolebindings", json=binding)
    robot = as_user("system:serviceaccount:default:robot")
    assert (await admin.get(PODS, headers=robot)).status_code == 200
    other = as_user("system:serviceaccount:kube-system:robot")
    assert (await admin.get(PODS, headers=other)).status_code == 403
    every_account = binding | {"metadata": {"name": "accounts"}}
    every_account["subjects"] = [{"kind": "Group", "name": "system:serviceaccounts:kube-system"}]
    await admin.post(f"{RBAC}/namespaces/default/rolebindings", json=every_account)
    assert (await admin.get(PODS, headers=other)).status_code == 200


async def test_resource_names_limit_get_and_a_list_selecting_that_name_but_never_create(
    admin: httpx.AsyncClient, sim: SimApiServer, lease: Any
) -> None:
    sim.store.create("leases", lease("mine"))
    sim.store.create("leases", lease("theirs"))
    only_mine = rule(
        "get,list,watch,update,create", "coordination.k8s.io", "leases", names=("mine",)
    )
    await admin.post(f"{RBAC}/namespaces/default/roles", json=role("mine", only_mine))
    binding = binding_manifest("mine", role="mine", user="alice", role_kind="Role")
    await admin.post(f"{RBAC}/namespaces/default/rolebindings", json=binding)
    alice = as_user("alice")
    assert (await admin.get(f"{LEASES}/mine", headers=alice)).status_code == 200
    assert (await admin.get(f"{LEASES}/theirs", headers=alice)).status_code == 403
    assert (await admin.get(LEASES, headers=alice)).status_code == 403
    by_name = await admin.get(LEASES, params={"fieldSelector": "metadata.name=mine"}, headers=alice)
    assert by_name.status_code == 200 and [
        i["metadata"]["name"] for i in by_name.json()["items"]
    ] == ["mine"]
    other = await admin.get(LEASES, params={"fieldSelector": "metadata.name=theirs"}, headers=alice)
    assert other.status_code == 403
    created = await admin.post(LEASES, json=lease("mine-too"), headers=alice)
    assert created.status_code == 403  # create has no name to match, as in kube


async def test_subresources_are_granted_apart_from_their_resource(
    admin: httpx.AsyncClient, sim: SimApiServer, pod: Any
) -> None:
    sim.store.create("pods", pod("p"))
    await admin.post(f"{RBAC}/clusterroles", json=role("pod-editor", rule("get,patch", "", "pods")))
    binding = binding_manifest("editors", role="pod-editor", user="alice")
    await admin.post(f"{RBAC}/clusterrolebindings", json=binding)
    alice = as_user("alice") | MERGE
    status = {"status": {"message": "hi"}}
    refused = await admin.patch(f"{PODS}/p/status", json=status, headers=alice)
    assert refused.status_code == 403
    assert 'cannot patch resource "pods/status"' in refused.json()["message"]
    statuses = role("statuses", rule("patch", "", "*/status"))
    await admin.post(f"{RBAC}/clusterroles", json=statuses)
    await admin.post(
        f"{RBAC}/clusterrolebindings", json=binding_manifest("st", role="statuses", user="alice")
    )
    assert (await admin.patch(f"{PODS}/p/status", json=status, headers=alice)).status_code == 200
    bind = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n"}}
    binding_refused = await admin.post(f"{PODS}/p/binding", json=bind, headers=as_user("alice"))
    assert 'cannot create resource "pods/binding"' in binding_refused.json()["message"]


async def test_deletecollection_and_watch_are_verbs_of_their_own(
    admin: httpx.AsyncClient,
) -> None:
    await admin.post(f"{RBAC}/clusterroles", json=role("lister", rule("list", "", "pods")))
    await admin.post(
        f"{RBAC}/clusterrolebindings", json=binding_manifest("l", role="lister", user="alice")
    )
    alice = as_user("alice")
    assert (await admin.get(PODS, headers=alice)).status_code == 200
    watch = await admin.get(PODS, params={"watch": "1", "timeoutSeconds": "1"}, headers=alice)
    assert 'cannot watch resource "pods"' in watch.json()["message"]
    wiped = await admin.delete(PODS, headers=alice)
    assert 'cannot deletecollection resource "pods"' in wiped.json()["message"]


async def test_a_grant_or_a_removal_takes_effect_with_the_write(admin: httpx.AsyncClient) -> None:
    alice = as_user("alice")
    assert (await admin.get("/api/v1/nodes", headers=alice)).status_code == 403
    await admin.post(f"{RBAC}/clusterroles", json=role("n", rule("list", "", "nodes")))
    await admin.post(
        f"{RBAC}/clusterrolebindings", json=binding_manifest("n", role="n", user="alice")
    )
    assert (await admin.get("/api/v1/nodes", headers=alice)).status_code == 200
    await admin.delete(f"{RBAC}/clusterrolebindings/n")
    assert (await admin.get("/api/v1/nodes", headers=alice)).status_code == 403


async def test_a_binding_to_a_missing_role_grants_nothing_until_the_role_exists(
    admin: httpx.AsyncClient,
) -> None:
    await admin.post(
        f"{RBAC}/clusterrolebindings", json=binding_manifest("n", role="n", user="alice")
    )
    assert (await admin.get("/api/v1/nodes", headers=as_user("alice"))).status_code == 403
    await admin.post(f"{RBAC}/clusterroles", json=role("n", rule("list", "", "nodes")))
    assert (await admin.get("/api/v1/nodes", headers=as_user("alice"))).status_code == 200


async def test_edit_gains_a_rule_from_a_cluster_role_labelled_to_aggregate_into_it(
    admin: httpx.AsyncClient, sim: SimApiServer, lease: Any
) -> None:
    edit = (await admin.get(f"{RBAC}/clusterroles/edit")).json()
    assert edit["aggregationRule"]["clusterRoleSelectors"] == [
        {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}}
    ]
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in edit["rules"]
    view = (await admin.get(f"{RBAC}/clusterroles/view")).json()
    assert all(r in edit["rules"] for r in view["rules"])  # edit aggregates view
    admin_rules = (await admin.get(f"{RBAC}/clusterroles/admin")).json()["rules"]
    assert all(r in admin_rules for r in edit["rules"])  # and admin aggregates edit
    await admin.post(
        f"{RBAC}/namespaces/default/rolebindings",
        json=binding_manifest("alice-edit", role="edit", user="alice"),
    )
    alice = as_user("alice")
    assert (await admin.get(LEASES, headers=alice)).status_code == 403
    leases = role("lease-editor", rule("get,list", "coordination.k8s.io", "leases"))
    leases["metadata"]["labels"] = {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}
    assert (await admin.post(f"{RBAC}/clusterroles", json=leases)).status_code == 201
    assert (await admin.get(LEASES, headers=alice)).status_code == 200
    admin_rules = (await admin.get(f"{RBAC}/clusterroles/admin")).json()["rules"]
    assert leases["rules"][0] in admin_rules  # through edit


async def test_the_users_grant_binds_edit_in_each_new_namespace_but_the_system_ones(
    lease: Any,
) -> None:
    options = ApiOptions(user_grant=UserGrant(except_namespaces=frozenset({"kube-system", "ops"})))
    async with run_apiserver(options=options) as sim, httpx.AsyncClient(base_url=sim.url) as api:
        for name in ("team-a", "ops"):
            await api.post("/api/v1/namespaces", json={"metadata": {"name": name}})
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        for namespace, expected in (("team-a", 201), ("default", 201), ("ops", 403)):
            path = f"/api/v1/namespaces/{namespace}/pods"
            created = await api.post(path, json=pod, headers=as_user("alice"))
            assert created.status_code == expected, (namespace, created.text)
        in_system = await api.get("/api/v1/namespaces/kube-system/pods", headers=as_user("alice"))
        assert in_system.status_code == 403
        token = "/api/v1/namespaces/team-a/serviceaccounts/default/token"
        minted = await api.post(token, json={"spec": {}}, headers=as_user("alice"))
        assert minted.status_code == 403  # edit does not mint tokens
        account = as_user("system:serviceaccount:team-a:default")
        assert (await api.get("/api/v1/namespaces/team-a/pods", headers=account)).status_code == 403


async def test_impersonation_needs_the_impersonate_verb_and_then_acts_as_the_target(
    admin: httpx.AsyncClient,
) -> None:
    await admin.post(f"{RBAC}/clusterroles", json=role("n", rule("list", "", "nodes")))
    binding = binding_manifest("ops", role="n", user="unused")
    binding["subjects"] = [{"kind": "Group", "name": "ops"}]
    await admin.post(f"{RBAC}/clusterrolebindings", json=binding)
    as_bob = {"Impersonate-User": "bob", "Impersonate-Group": "ops"}
    assert (await admin.get("/api/v1/nodes", headers=as_bob)).status_code == 200
    assert (
        await admin.get("/api/v1/nodes", headers={"Impersonate-User": "bob"})
    ).status_code == 403
    by_alice = await admin.get("/api/v1/nodes", headers=as_bob | as_user("alice"))
    assert by_alice.status_code == 403
    assert by_alice.json()["message"] == (
        'users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API '
        'group "" at the cluster scope'
    )
    groups_only = await admin.get("/api/v1/nodes", headers={"Impersonate-Group": "ops"})
    assert groups_only.status_code == 400 and "Impersonate-User" in groups_only.json()["message"]


async def test_an_editor_may_impersonate_a_service_account_of_its_namespace_only(
    admin: httpx.AsyncClient,
) -> None:
    await admin.post(
        f"{RBAC}/namespaces/default/rolebindings",
        json=binding_manifest("alice-edit", role="edit", user="alice"),
    )
    robot = {"Impersonate-User": "system:serviceaccount:default:robot"} | as_user("alice")
    acting = await admin.get(PODS, headers=robot)
    assert acting.status_code == 403  # impersonation allowed; the robot itself reads nothing
    assert 'User "system:serviceaccount:default:robot" cannot list' in acting.json()["message"]
    foreign = {"Impersonate-User": "system:serviceaccount:rgpu-system:rgpu-allocator"}
    refused = await admin.get(PODS, headers=foreign | as_user("alice"))
    assert 'serviceaccounts "rgpu-allocator" is forbidden' in refused.json()["message"]


async def test_discovery_paths_need_the_discovery_role_every_authenticated_user_has(
    admin: httpx.AsyncClient,
) -> None:
    assert (await admin.get("/version", headers=as_user("alice"))).status_code == 200
    assert (await admin.get("/apis", headers=as_user("alice"))).status_code == 200
    await admin.delete(f"{RBAC}/clusterrolebindings/system:discovery")
    assert (await admin.get("/apis", headers=as_user("alice"))).status_code == 403
    assert (await admin.get("/version", headers=as_user("alice"))).status_code == 200  # public
    refused = await admin.get("/openapi/v3", headers=as_user("alice"))
    assert refused.json()["message"] == 'forbidden: User "alice" cannot get path "/openapi/v3"'


async def test_refusals_are_kept_for_whoever_judges_the_run(
    admin: httpx.AsyncClient, sim: SimApiServer
) -> None:
    await admin.get(PODS, headers=as_user("system:serviceaccount:rgpu-system:rgpu-metrics"))
    await admin.get("/api/v1/nodes", headers=as_user("alice"))
    (refusal,) = sim.refusals.of("system:serviceaccount:rgpu-system:")
    assert refusal.describe() == (
        "system:serviceaccount:rgpu-system:rgpu-metrics list pods in default"
    )
    assert sim.refusals.total == 2


async def test_invalid_rbac_objects_are_refused_naming_the_field(admin: httpx.AsyncClient) -> None:
    bad_role = role("bad", {"apiGroups": [""], "resources": ["pods"]})
    refused = await admin.post(f"{RBAC}/clusterroles", json=bad_role)
    assert refused.status_code == 422
    assert "rules[0].verbs: Required value" in refused.json()["message"]
    urls = role("urls", {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}, namespace="default")
    namespaced = await admin.post(f"{RBAC}/namespaces/default/roles", json=urls)
    assert "namespaced rules cannot apply to non-resource URLs" in namespaced.json()["message"]
    binding = binding_manifest("b", role="edit", user="alice")
    binding["subjects"][0]["kind"] = "Robot"
    wrong = await admin.post(f"{RBAC}/clusterrolebindings", json=binding)
    assert "subjects[0].kind: Unsupported value" in wrong.json()["message"]
    good = binding_manifest("b", role="edit", user="alice")
    assert (await admin.post(f"{RBAC}/clusterrolebindings", json=good)).status_code == 201
    changed = (await admin.get(f"{RBAC}/clusterrolebindings/b")).json()
    changed["roleRef"]["name"] = "cluster-admin"
    swapped = await admin.put(f"{RBAC}/clusterrolebindings/b", json=changed)
    assert "cannot change roleRef" in swapped.json()["message"]


async def test_a_bearer_tokens_account_is_authorized_as_that_account(
    admin: httpx.AsyncClient,
) -> None:
    await admin.post("/api/v1/namespaces/default/serviceaccounts", json={"metadata": {"name": "r"}})
    issued = await admin.post("/api/v1/namespaces/default/serviceaccounts/r/token", json={})
    bearer = {"Authorization": f"Bearer {issued.json()['status']['token']}"}
    # The token wins over the X-Sim-User header, as authentication does in kube.
    refused = await admin.get("/api/v1/nodes", headers=bearer | as_user("kubernetes-admin"))
    assert 'User "system:serviceaccount:default:r" cannot list' in refused.json()["message"]
