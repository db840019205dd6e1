"""rgpu's RBAC and admission policies, applied to a simulated apiserver from k8s/base as written,
and the verdict check that reads what the apiserver refused rgpu's accounts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from rgpu_kubesim import ApiOptions, SimApiServer, run_apiserver
from rgpu_kubesim.network import LUPINE_NAMESPACE
from rgpu_sim.stack_rbac import (
    PLURALS,
    SYSTEM_NAMESPACE,
    apply_rbac,
    check_authorized,
    manifests,
    user_grant,
)

pytestmark = pytest.mark.anyio

SYSTEM = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}"


def account(service: str) -> dict[str, str]:
    return {"X-Sim-User": f"system:serviceaccount:{SYSTEM_NAMESPACE}:rgpu-{service}"}


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[SimApiServer, httpx.AsyncClient]]:
    async with (
        run_apiserver(options=ApiOptions(user_grant=user_grant())) as sim,
        httpx.AsyncClient(base_url=sim.url, trust_env=False) as client,
    ):
        sim.store.create("namespaces", {"metadata": {"name": SYSTEM_NAMESPACE}})
        apply_rbac(sim.store)
        yield sim, client


def test_manifests_are_read_from_k8s_base_accounts_and_roles_before_bindings() -> None:
    found = manifests()
    kinds = [o["kind"] for o in found]
    assert kinds == sorted(kinds, key=list(PLURALS).index)
    accounts = {o["metadata"]["name"] for o in found if o["kind"] == "ServiceAccount"}
    assert {"rgpu-allocator", "rgpu-discovery", "rgpu-extender", "rgpu-metrics"} <= accounts
    policies = [o for o in found if o["kind"].startswith("ValidatingAdmissionPolicy")]
    assert {o["metadata"]["name"] for o in policies} == {"rgpu-lease-owners"}


def test_a_checkout_without_k8s_base_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="run it from a checkout of rgpu"):
        manifests(tmp_path)


async def test_each_account_mints_a_token_for_itself_and_for_no_other_account(
    cluster: tuple[SimApiServer, httpx.AsyncClient],
) -> None:
    _, client = cluster
    own = await client.post(
        f"{SYSTEM}/serviceaccounts/rgpu-extender/token", json={}, headers=account("extender")
    )
    assert own.status_code == 201, own.text
    other = await client.post(
        f"{SYSTEM}/serviceaccounts/rgpu-allocator/token", json={}, headers=account("extender")
    )
    assert other.status_code == 403, other.text
    assert 'cannot create resource "serviceaccounts/token"' in other.json()["message"]


async def test_users_get_edit_outside_rgpus_namespaces_and_nothing_in_them(
    cluster: tuple[SimApiServer, httpx.AsyncClient],
) -> None:
    sim, client = cluster
    sim.store.create("namespaces", {"metadata": {"name": "team-a"}})
    alice = {"X-Sim-User": "alice"}
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    created = await client.post("/api/v1/namespaces/team-a/pods", json=pod, headers=alice)
    assert created.status_code == 201, created.text
    refused = await client.get(f"{SYSTEM}/pods", headers=alice)
    assert refused.status_code == 403, refused.text
    sim.store.create("namespaces", {"metadata": {"name": LUPINE_NAMESPACE}})
    opened = {"metadata": {"name": "let-me-in"}, "spec": {"podSelector": {}, "ingress": [{}]}}
    policies = f"/apis/networking.k8s.io/v1/namespaces/{LUPINE_NAMESPACE}/networkpolicies"
    squat = await client.post(policies, json=opened, headers=alice)
    assert squat.status_code == 403, squat.text
    assert 'cannot create resource "networkpolicies"' in squat.json()["message"]


async def test_the_verdict_check_fails_naming_what_an_rgpu_account_was_refused(
    cluster: tuple[SimApiServer, httpx.AsyncClient],
) -> None:
    sim, client = cluster
    assert check_authorized(sim).passed
    await client.get(f"{SYSTEM}/pods", headers={"X-Sim-User": "mallory"})
    assert check_authorized(sim).passed, "a user's refusal is not rgpu's missing grant"
    nodes = await client.delete("/api/v1/nodes/gpu-01", headers=account("metrics"))
    assert nodes.status_code == 403, nodes.text
    check = check_authorized(sim)
    assert not check.passed
    assert check.detail == "system:serviceaccount:rgpu-system:rgpu-metrics delete nodes gpu-01"
