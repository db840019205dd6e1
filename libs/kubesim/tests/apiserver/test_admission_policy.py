"""ValidatingAdmissionPolicy and its bindings, enforced with real CEL as kube-apiserver does —
including rgpu's own Lease-owners policy read from k8s/."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from rgpu_kubesim import SimApiServer

pytestmark = pytest.mark.anyio

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
LEASE_OWNERS = (
    Path(__file__).resolve().parents[4] / "k8s" / "base" / "policies" / "lease-owners.yaml"
)
ACCOUNT = "system:serviceaccount:rgpu-system:rgpu-{}"


@pytest.fixture
async def api(sim: SimApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        yield client


def policy(name: str, *validations: dict[str, Any], **spec: Any) -> dict[str, Any]:
    rules = [
        {
            "apiGroups": ["coordination.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["leases"],
        }
    ]
    body = {"matchConstraints": {"resourceRules": rules}, "validations": list(validations)}
    return {"metadata": {"name": name}, "spec": body | spec}


def binding(name: str, *actions: str, **spec: Any) -> dict[str, Any]:
    body = {"policyName": name, "validationActions": list(actions or ("Deny",))}
    return {"metadata": {"name": name}, "spec": body | spec}


async def install(api: httpx.AsyncClient, *objects: tuple[str, dict[str, Any]]) -> None:
    for plural, body in objects:
        created = await api.post(f"{ADMISSION}/{plural}", json=body)
        assert created.status_code == 201, created.text


def lease(name: str, holder: str = "a", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name} | ({"labels": labels} if labels else {})
    return {"metadata": meta, "spec": {"holderIdentity": holder}}


async def test_a_false_validation_denies_the_write_with_kubes_message(
    api: httpx.AsyncClient, sim: SimApiServer
) -> None:
    rule = {"expression": "object.spec.holderIdentity != 'mallory'", "message": "no mallory"}
    await install(
        api,
        ("validatingadmissionpolicies", policy("holders", rule)),
        ("validatingadmissionpolicybindings", binding("holders")),
    )
    assert (await api.post(LEASES, json=lease("ok"))).status_code == 201
    refused = await api.post(LEASES, json=lease("bad", "mallory"))
    assert refused.status_code == 422
    body = refused.json()
    assert body["reason"] == "Invalid"
    assert body["message"] == (
        "leases.coordination.k8s.io \"bad\" is forbidden: ValidatingAdmissionPolicy 'holders' "
        "with binding 'holders' denied request: no mallory"
    )
    assert body["details"]["causes"] == [{"message": body["message"].split(": ", 1)[1]}]
    assert sim.refusals.snapshot()[-1].describe() == "kubernetes-admin create leases bad in default"


async def test_the_message_expression_and_the_reason_shape_the_denial(
    api: httpx.AsyncClient,
) -> None:
    rule = {
        "expression": "object.spec.holderIdentity.startsWith('team-')",
        "messageExpression": "'holder ' + object.spec.holderIdentity + ' is not a team'",
        "reason": "Forbidden",
    }
    await install(
        api,
        ("validatingadmissionpolicies", policy("teams", rule)),
        ("validatingadmissionpolicybindings", binding("teams")),
    )
    refused = await api.post(LEASES, json=lease("x", "bob"))
    assert refused.status_code == 403 and refused.json()["reason"] == "Forbidden"
    assert refused.json()["message"].endswith("denied request: holder bob is not a team")


async def test_variables_match_conditions_and_the_old_object_are_evaluated(
    api: httpx.AsyncClient, sim: SimApiServer
) -> None:
    rule = {"expression": "variables.kept", "message": "holder is fixed"}
    spec = {
        "variables": [
            {"name": "before", "expression": "oldObject.spec.holderIdentity"},
            {
                "name": "kept",
                "expression": "request.operation == 'DELETE' || variables.before == "
                "object.spec.holderIdentity",
            },
        ],
        "matchConditions": [{"name": "updates", "expression": "request.operation != 'CREATE'"}],
    }
    await install(
        api,
        ("validatingadmissionpolicies", policy("fixed", rule, **spec)),
        ("validatingadmissionpolicybindings", binding("fixed")),
    )
    assert (await api.post(LEASES, json=lease("l", "a"))).status_code == 201
    current = (await api.get(f"{LEASES}/l")).json()
    current["spec"]["holderIdentity"] = "b"
    refused = await api.put(f"{LEASES}/l", json=current)
    assert refused.status_code == 422 and "holder is fixed" in refused.json()["message"]
    assert (await api.delete(f"{LEASES}/l")).status_code == 200


async def test_resource_names_selectors_and_exclusions_narrow_what_a_policy_judges(
    api: httpx.AsyncClient,
) -> None:
    never = {"expression": "false", "message": "judged"}
    judged = policy("named", never)
    judged["spec"]["matchConstraints"]["resourceRules"][0]["resourceNames"] = ["guarded"]
    labelled = policy("labelled", never)
    labelled["spec"]["matchConstraints"]["objectSelector"] = {"matchLabels": {"guard": "yes"}}
    excluded = policy("excluded", never)
    excluded["spec"]["matchConstraints"]["excludeResourceRules"] = [
        dict(excluded["spec"]["matchConstraints"]["resourceRules"][0])
    ]
    await install(
        api,
        *(("validatingadmissionpolicies", p) for p in (judged, labelled, excluded)),
        *(("validatingadmissionpolicybindings", binding(n)) for n in ("named", "labelled")),
        ("validatingadmissionpolicybindings", binding("excluded")),
    )
    assert (await api.post(LEASES, json=lease("free"))).status_code == 201
    assert (await api.post(LEASES, json=lease("guarded"))).status_code == 422
    assert (await api.post(LEASES, json=lease("tagged", guard="yes"))).status_code == 422


async def test_a_binding_narrows_by_namespace_and_warn_alone_denies_nothing(
    api: httpx.AsyncClient,
) -> None:
    never = {"expression": "false"}
    only_team = binding("team", matchResources={"namespaceSelector": {"matchLabels": {"t": "1"}}})
    await install(
        api,
        ("validatingadmissionpolicies", policy("team", never)),
        ("validatingadmissionpolicybindings", only_team),
        ("validatingadmissionpolicies", policy("warned", never)),
        ("validatingadmissionpolicybindings", binding("warned", "Warn")),
    )
    assert (await api.post(LEASES, json=lease("default-ns"))).status_code == 201
    await api.post("/api/v1/namespaces", json={"metadata": {"name": "t", "labels": {"t": "1"}}})
    refused = await api.post("/apis/coordination.k8s.io/v1/namespaces/t/leases", json=lease("x"))
    assert refused.status_code == 422
    assert "failed expression: false" in refused.json()["message"]


async def test_an_expression_error_follows_the_failure_policy(api: httpx.AsyncClient) -> None:
    broken = {"expression": "object.spec.missing == 'x'"}
    await install(
        api,
        ("validatingadmissionpolicies", policy("closed", broken)),
        ("validatingadmissionpolicybindings", binding("closed")),
        ("validatingadmissionpolicies", policy("open", broken, failurePolicy="Ignore")),
        ("validatingadmissionpolicybindings", binding("open")),
    )
    refused = await api.post(LEASES, json=lease("x"))
    assert refused.status_code == 422
    assert "'closed'" in refused.json()["message"] and "resulted in error" in refused.text
    await api.delete(f"{ADMISSION}/validatingadmissionpolicybindings/closed")
    assert (await api.post(LEASES, json=lease("x"))).status_code == 201


async def test_a_policy_needing_params_fails_closed_as_unsupported(api: httpx.AsyncClient) -> None:
    needs = policy(
        "params", {"expression": "true"}, paramKind={"apiVersion": "v1", "kind": "ConfigMap"}
    )
    await install(
        api,
        ("validatingadmissionpolicies", needs),
        ("validatingadmissionpolicybindings", binding("params")),
    )
    refused = await api.post(LEASES, json=lease("x"))
    assert refused.status_code == 422 and "paramKind ConfigMap is not supported" in refused.text


async def test_invalid_policies_and_bindings_are_refused_when_written(
    api: httpx.AsyncClient,
) -> None:
    bad = policy("bad", {"expression": "object.spec.("})
    refused = await api.post(f"{ADMISSION}/validatingadmissionpolicies", json=bad)
    assert refused.status_code == 422 and "spec.validations[0].expression" in refused.text
    unknown = policy("unknown", {"expression": "secrets.x == 1"})
    undeclared = await api.post(f"{ADMISSION}/validatingadmissionpolicies", json=unknown)
    assert "undeclared reference to 'secrets'" in undeclared.json()["message"]
    empty = policy("empty")
    assert (
        await api.post(f"{ADMISSION}/validatingadmissionpolicies", json=empty)
    ).status_code == 422
    both = binding("b", "Deny", "Warn")
    clash = await api.post(f"{ADMISSION}/validatingadmissionpolicybindings", json=both)
    assert clash.status_code == 422 and "must not contain both Deny and Warn" in clash.text
    nameless = {"metadata": {"name": "n"}, "spec": {"validationActions": ["Deny"]}}
    missing = await api.post(f"{ADMISSION}/validatingadmissionpolicybindings", json=nameless)
    assert "spec.policyName: Required value" in missing.json()["message"]


# -- rgpu's own policy, as k8s/ ships it ----------------------------------------------------------


@pytest.fixture
async def rgpu(api: httpx.AsyncClient) -> httpx.AsyncClient:
    await api.post("/api/v1/namespaces", json={"metadata": {"name": "rgpu-system"}})
    for document in yaml.safe_load_all(LEASE_OWNERS.read_text()):
        plural = {
            "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
            "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
        }[document["kind"]]
        created = await api.post(f"{ADMISSION}/{plural}", json=document)
        assert created.status_code == 201, created.text
    lease_writer = {
        "metadata": {"name": "lease-writer"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}],
    }
    await api.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", json=lease_writer)
    writers = {
        "metadata": {"name": "lease-writers"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "lease-writer",
        },
        "subjects": [{"kind": "Group", "name": "system:serviceaccounts:rgpu-system"}],
    }
    await api.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", json=writers)
    return api


@pytest.mark.parametrize(
    ("service", "name", "allowed"),
    [
        ("allocator", "rgpu-gpu-01", True),
        ("allocator", "rgpu-allocator-leader", True),
        ("allocator", "rgpu-metrics-leader", False),
        ("allocator", "rgpu-scheduler", False),
        ("allocator", "lupine-gpu-01", False),
        ("discovery", "lupine-gpu-01", True),
        ("discovery", "discovery-member-discovery-7d9f", True),
        ("discovery", "rgpu-gpu-01", False),
        ("discovery", "rgpu-allocator-leader", False),
        ("metrics", "rgpu-metrics-leader", True),
        ("metrics", "rgpu-gpu-01", False),
        ("scheduler", "rgpu-scheduler", True),
        ("scheduler", "rgpu-gpu-01", False),
        ("extender", "rgpu-gpu-01", False),
    ],
)
async def test_each_rgpu_account_writes_only_its_own_leases(
    rgpu: httpx.AsyncClient, service: str, name: str, allowed: bool
) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/rgpu-system/leases"
    headers = {"X-Sim-User": ACCOUNT.format(service)}
    created = await rgpu.post(path, json=lease(name), headers=headers)
    assert (created.status_code == 201) is allowed, created.text
    if not allowed:
        assert created.status_code == 403
        assert "ValidatingAdmissionPolicy 'rgpu-lease-owners'" in created.json()["message"]


async def test_discovery_cannot_rewrite_or_delete_a_claim_lease_but_a_human_admin_can(
    rgpu: httpx.AsyncClient,
) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/rgpu-system/leases"
    allocator, discovery = ({"X-Sim-User": ACCOUNT.format(s)} for s in ("allocator", "discovery"))
    assert (await rgpu.post(path, json=lease("rgpu-gpu-01"), headers=allocator)).status_code == 201
    claim = (await rgpu.get(f"{path}/rgpu-gpu-01")).json()
    claim["spec"]["holderIdentity"] = "discovery"
    rewritten = await rgpu.put(f"{path}/rgpu-gpu-01", json=claim, headers=discovery)
    assert rewritten.status_code == 403, rewritten.text
    assert "is not system:serviceaccount:rgpu-system:rgpu-discovery's to write" in rewritten.text
    assert (await rgpu.delete(f"{path}/rgpu-gpu-01", headers=discovery)).status_code == 403
    assert (await rgpu.put(f"{path}/rgpu-gpu-01", json=claim)).status_code == 200
