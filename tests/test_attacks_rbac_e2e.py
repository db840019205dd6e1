"""The attack suite, against the simulated cluster's RBAC: the running stack (`rgpu up --sim`'s
processes, k8s/ RBAC and admission policies applied as a cluster applies them), attacked through
the apiserver by a user with ``edit`` where users work, and by whoever holds one service's
account. Each attack is refused with kube's 403 while an honest GPU pod is still served, and
rgpu's own accounts are never refused anything while they do their work."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rgpu_allocator.claims import lease_name
from rgpu_kubesim.kubelet import KubeletConfig
from rgpu_sim.stack import Stack, StackOptions, run_stack
from rgpu_sim.stack_rbac import refused
from rgpu_testkit import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(240)]

SYSTEM = "/api/v1/namespaces/rgpu-system"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/rgpu-system/leases"
PODS = "/api/v1/namespaces/default/pods"
MALLORY = {"X-Sim-User": "mallory"}
MERGE = {"Content-Type": "application/merge-patch+json"}


def account(service: str) -> dict[str, str]:
    """Acting as ``service``'s account (whoever stole its credentials)."""
    return {"X-Sim-User": f"system:serviceaccount:rgpu-system:rgpu-{service}"}


def _pod(name: str, *, gpus: int = 0) -> dict[str, Any]:
    limits = {"nvidia.com/remote-gpu": str(gpus)} if gpus else {}
    container = {"name": "main", "image": "busybox", "resources": {"limits": limits}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [container]},
    }


async def _ran(stack: Stack, name: str) -> None:
    await eventually(
        lambda: any(r.key == f"default/{name}" for r in stack.kubelet.records.values()),
        timeout=60,
        what=f"GPU pod {name} started",
    )


async def _token(stack: Stack, service: str) -> dict[str, str]:
    """The account's API token, minted as its kubelet would project it."""
    minted = await stack.apiserver.post(f"{SYSTEM}/serviceaccounts/rgpu-{service}/token", json={})
    assert minted.status_code == 201, minted.text
    return {"Authorization": f"Bearer {minted.json()['status']['token']}"}


def _forbidden(reply: httpx.Response, *words: str) -> None:
    assert reply.status_code == 403, reply.text
    message = reply.json()["message"]
    assert all(word in message for word in words), message


async def _leases(stack: Stack) -> dict[str, dict[str, Any]]:
    listed = await stack.apiserver.get(LEASES)
    return {item["metadata"]["name"]: item for item in listed.json()["items"]}


async def test_users_and_stolen_service_accounts_are_refused_what_rgpus_rbac_does_not_grant() -> (
    None
):
    options = StackOptions(
        servers=2, cards=2, clients=2, seed=11, kubelet=KubeletConfig(start_delay_seconds=0.1)
    )
    async with run_stack(options) as stack:
        api = stack.apiserver
        honest = await stack.create_pod(_pod("honest", gpus=1))
        assert honest.status_code == 201, honest.text
        await _ran(stack, "honest")
        servers = sorted(stack.fleet.endpoints())
        leases = await _leases(stack)
        held = [lease_name(s) for s in servers if lease_name(s) in leases]
        assert held, sorted(leases)
        claim = leases[held[0]]
        states = [n for n in leases if n.startswith("lupine-")]
        members = [n for n in leases if n.startswith("discovery-member-")]
        assert states and members, sorted(leases)
        assert refused(stack.sim) == (), "rgpu's own work needs a grant k8s/ lacks"

        # A user with edit where users work mints no token for an rgpu account...
        minted = await api.post(
            f"{SYSTEM}/serviceaccounts/rgpu-extender/token",
            json={"spec": {"audiences": ["rgpu-allocator"]}},
            headers=MALLORY,
        )
        _forbidden(
            minted,
            'serviceaccounts "rgpu-extender" is forbidden: User "mallory" cannot create resource '
            '"serviceaccounts/token" in API group "" in the namespace "rgpu-system"',
        )
        # ...writes no claim, probe-state or membership Lease...
        forged = {**claim, "spec": {**claim["spec"], "holderIdentity": "mallory"}}
        _forbidden(await api.put(f"{LEASES}/{held[0]}", json=forged, headers=MALLORY), "update")
        for name in (held[0], states[0], members[0]):
            _forbidden(await api.delete(f"{LEASES}/{name}", headers=MALLORY), "delete")
        free = {"metadata": {"name": lease_name("squatted")}, "spec": {"holderIdentity": "m"}}
        _forbidden(
            await api.post(LEASES, json=free, headers=MALLORY), 'cannot create resource "leases"'
        )
        # ...and creates no PriorityClass to jump every queue.
        urgent = {"metadata": {"name": "mine-first"}, "value": 1_000_000_000}
        _forbidden(
            await api.post(
                "/apis/scheduling.k8s.io/v1/priorityclasses", json=urgent, headers=MALLORY
            ),
            "at the cluster scope",
        )

        # One service's account does none of another service's writes.
        binding = {"metadata": {"name": "honest"}, "target": {"kind": "Node", "name": "client-01"}}
        _forbidden(
            await api.post(f"{PODS}/honest/binding", json=binding, headers=account("metrics"))
        )
        annotate = {"metadata": {"annotations": {"rgpu.io/retry-at": "0"}}}
        patched = await api.patch(
            f"{PODS}/honest", json=annotate, headers=account("extender") | MERGE
        )
        _forbidden(patched, 'cannot patch resource "pods"')
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "honest"}}
        evicted = await api.post(
            f"{PODS}/honest/eviction", json=eviction, headers=account("discovery")
        )
        _forbidden(evicted, 'cannot create resource "pods/eviction"')
        stolen = await api.post(
            f"{SYSTEM}/serviceaccounts/rgpu-extender/token", json={}, headers=account("allocator")
        )
        _forbidden(stolen, 'cannot create resource "serviceaccounts/token"')
        rewrite = await api.put(f"{LEASES}/{held[0]}", json=forged, headers=account("extender"))
        _forbidden(rewrite, 'cannot update resource "leases"')

        # Discovery's own token may write Leases in rgpu-system, but not the allocator's: the
        # admission policy refuses the rewrite and the delete of a claim; metrics' token, which
        # may create its leader Lease, creates no claim for a free server.
        as_discovery = await _token(stack, "discovery")
        _forbidden(
            await api.put(f"{LEASES}/{held[0]}", json=forged, headers=as_discovery),
            "ValidatingAdmissionPolicy 'rgpu-lease-owners'",
            "rgpu-discovery's to write",
        )
        _forbidden(
            await api.delete(f"{LEASES}/{held[0]}", headers=as_discovery), "rgpu-lease-owners"
        )
        squat = {"metadata": {"name": lease_name(servers[-1]) + "-x"}, "spec": {}}
        _forbidden(
            await api.post(LEASES, json=squat, headers=await _token(stack, "metrics")),
            "rgpu-metrics's",
        )
        after = await _leases(stack)
        assert after[held[0]]["spec"]["holderIdentity"] != "mallory"
        assert after[held[0]]["metadata"]["uid"] == claim["metadata"]["uid"]

        # The honest keep being served, and rgpu's accounts were refused only what the attacks
        # above tried in their names.
        assert (await api.delete(f"{PODS}/honest")).status_code == 200
        second = await stack.create_pod(_pod("second", gpus=1))
        assert second.status_code == 201, second.text
        await _ran(stack, "second")
        # Eight refusals were provoked in the accounts' names above; nothing else was refused.
        assert len(refused(stack.sim)) == 8, [r.describe() for r in refused(stack.sim)]
