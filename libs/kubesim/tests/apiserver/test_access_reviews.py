"""authorization.k8s.io/v1 reviews: asking RBAC instead of trying, as kubectl auth can-i does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from rgpu_kubesim import SimApiServer
from rgpu_testkit import binding_manifest

pytestmark = pytest.mark.anyio

AUTHZ = "/apis/authorization.k8s.io/v1"
ALICE = {"X-Sim-User": "alice"}


@pytest.fixture
async def api(sim: SimApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        yield client


def resource(verb: str, resource: str, namespace: str = "default", **more: str) -> dict[str, Any]:
    attributes = {"verb": verb, "resource": resource, "namespace": namespace, **more}
    return {"spec": {"resourceAttributes": attributes}}


async def ask(api: httpx.AsyncClient, kind: str, body: dict[str, Any], **headers: str) -> Any:
    reply = await api.post(f"{AUTHZ}/{kind}", json=body, headers=headers)
    assert reply.status_code == 201, reply.text
    return reply.json()


async def test_a_user_asks_what_it_may_do_and_hears_which_binding_allows_it(
    api: httpx.AsyncClient,
) -> None:
    answer = await ask(api, "selfsubjectaccessreviews", resource("create", "pods"), **ALICE)
    assert answer["kind"] == "SelfSubjectAccessReview"
    assert answer["status"] == {
        "allowed": True,
        "reason": 'RBAC: allowed by RoleBinding "kubesim:users:edit/default" of ClusterRole '
        '"edit" to Group "kubesim:users"',
    }
    denied = await ask(api, "selfsubjectaccessreviews", resource("get", "leases"), **ALICE)
    assert denied["status"] == {"allowed": False}
    system = resource("create", "pods", "kube-system")
    assert (await ask(api, "selfsubjectaccessreviews", system, **ALICE))["status"][
        "allowed"
    ] is False
    path = {"spec": {"nonResourceAttributes": {"verb": "get", "path": "/healthz"}}}
    assert (await ask(api, "selfsubjectaccessreviews", path, **ALICE))["status"]["allowed"]


async def test_a_review_honours_resource_names_and_subresources(api: httpx.AsyncClient) -> None:
    status = resource("patch", "pods", subresource="status")
    assert not (await ask(api, "selfsubjectaccessreviews", status, **ALICE))["status"]["allowed"]
    evict = resource("create", "pods", subresource="eviction", name="web")
    assert (await ask(api, "selfsubjectaccessreviews", evict, **ALICE))["status"]["allowed"]


async def test_subject_access_review_asks_for_anyone_but_only_for_who_may_ask(
    api: httpx.AsyncClient,
) -> None:
    body = resource("list", "nodes", "") | {}
    body["spec"] |= {"user": "bob", "groups": ["ops"]}
    assert (await ask(api, "subjectaccessreviews", body))["status"] == {"allowed": False}
    everything = resource("delete", "nodes", "")
    everything["spec"] |= {"user": "root", "groups": ["system:masters"]}
    assert (await ask(api, "subjectaccessreviews", everything))["status"]["allowed"]
    refused = await api.post(f"{AUTHZ}/subjectaccessreviews", json=body, headers=ALICE)
    assert refused.status_code == 403
    delegate = binding_manifest("delegate", role="system:auth-delegator", user="alice")
    await api.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", json=delegate)
    assert (await ask(api, "subjectaccessreviews", body, **ALICE))["status"] == {"allowed": False}


async def test_a_local_review_is_about_its_own_namespace(api: httpx.AsyncClient) -> None:
    body = resource("create", "pods", "")
    body["spec"] |= {"user": "carol", "groups": ["kubesim:users"]}
    local = f"{AUTHZ}/namespaces/default/localsubjectaccessreviews"
    answer = await api.post(local, json=body)
    assert answer.status_code == 201 and answer.json()["status"]["allowed"]
    assert answer.json()["metadata"]["namespace"] == "default"
    elsewhere = resource("create", "pods", "kube-system")
    elsewhere["spec"] |= {"user": "carol"}
    mismatch = await api.post(local, json=elsewhere)
    assert mismatch.status_code == 422
    assert "spec.resourceAttributes.namespace" in mismatch.json()["message"]


async def test_a_review_without_attributes_or_subject_is_invalid_naming_the_field(
    api: httpx.AsyncClient,
) -> None:
    empty = await api.post(f"{AUTHZ}/selfsubjectaccessreviews", json={"spec": {}})
    assert empty.status_code == 422
    assert "exactly one of nonResourceAttributes or resourceAttributes" in empty.json()["message"]
    nobody = await api.post(f"{AUTHZ}/subjectaccessreviews", json=resource("get", "pods"))
    assert nobody.status_code == 422
    assert "spec.user" in nobody.json()["message"]
    not_json = await api.post(
        f"{AUTHZ}/selfsubjectaccessreviews",
        content=b"[1]",
        headers={"Content-Type": "application/json"},
    )
    assert not_json.status_code == 400
    listed = await api.get(f"{AUTHZ}/selfsubjectaccessreviews")
    assert listed.status_code == 405


async def test_a_rules_review_lists_what_the_user_may_do_in_a_namespace(
    api: httpx.AsyncClient,
) -> None:
    body = {"spec": {"namespace": "default"}}
    answer = await ask(api, "selfsubjectrulesreviews", body, **ALICE)
    rules = answer["status"]["resourceRules"]
    assert any("pods" in r["resources"] and "create" in r["verbs"] for r in rules)
    assert {
        "verbs": ["get"],
        "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
    } in answer["status"]["nonResourceRules"]
    assert answer["status"]["incomplete"] is False
    system = await ask(
        api, "selfsubjectrulesreviews", {"spec": {"namespace": "kube-system"}}, **ALICE
    )
    assert not any("pods" in r["resources"] for r in system["status"]["resourceRules"])
