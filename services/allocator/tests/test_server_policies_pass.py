"""One pass of the server-policies keeper, on its caches and a recording API: which servers a
pass looks at, and which writes it makes (the apiserver side is test_server_policies.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import rgpu_testkit as tk
from rgpu_allocator.claims import LeaseRecord
from rgpu_allocator.ledger import Ledger
from rgpu_allocator.pods import PodIndex, PodInfo, pod_info
from rgpu_allocator.policy_objects import PolicyRecord, policy_name, read_policy
from rgpu_allocator.server_policies import ServerPolicies
from rgpu_allocator.settings import ServerPolicySettings
from rgpu_contracts import ClaimState, PodUID, ServerName
from rgpu_placement import FleetView
from rgpu_runtime.feeds import DiscoveryMirror

pytestmark = pytest.mark.anyio

SERVERS = ("gpu-1", "gpu-2", "gpu-3")


class RecordingApi:
    """The mode's calls, answered from a dict of stored policies."""

    namespace = "rgpu-lupine"
    policy_pages = watch_policies = pod_pages = watch_pods = None

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.version = 0

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        self.stored[body["metadata"]["name"]] = stored
        return stored

    async def create_policy(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", body["metadata"]["name"]))
        return self._store(body)

    async def replace_policy(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("update", name))
        return self._store(body)

    async def delete_policy(self, name: str) -> None:
        self.calls.append(("delete", name))
        self.stored.pop(name, None)


def holder(index: int, *, ip: str | None = None) -> PodInfo:
    status: dict[str, Any] = {"phase": "Running", "podIP": ip or f"10.0.0.{index}"}
    raw = {
        "metadata": {"uid": f"uid-{index}", "namespace": "ml", "name": f"p{index}"},
        "spec": {"nodeName": "client-1"},
        "status": status,
    }
    info = pod_info(raw)
    assert info is not None
    return info


def keeper() -> tuple[ServerPolicies, RecordingApi, PodIndex, Ledger]:
    discovery = DiscoveryMirror(FleetView.build, topology_keys=())
    discovery.view = FleetView.build(
        tk.fleet(servers=[tk.server(name=s) for s in SERVERS]), None, ()
    )
    ledger, pods = Ledger(), PodIndex()
    records = []
    for i, server in enumerate(SERVERS, start=1):
        pod = tk.pod_ref(name=f"p{i}", namespace="ml", uid=f"uid-{i}")
        claim = tk.claim(server=server, pod=pod, state=ClaimState.BOUND)
        records.append(
            LeaseRecord(
                name=f"rgpu-{server}",
                server=ServerName(server),
                resource_version="1",
                claims=(claim,),
            )
        )
    ledger.replace_all(records)
    pods.replace_all({PodUID(f"uid-{i}"): holder(i) for i in range(1, len(SERVERS) + 1)})
    api = RecordingApi()
    policies = ServerPolicies(
        api,  # type: ignore[arg-type]
        ledger=ledger,
        pods=pods,
        discovery=discovery,
        settings=ServerPolicySettings(enabled=True),
        system_namespace="rgpu-system",
        leading=lambda: True,
        registry=CollectorRegistry(),
    )
    # The caches as their reflectors leave them once listed.
    policies.policies.synced = policies.lupine_pods.synced = True
    return policies, api, pods, ledger


async def test_the_first_pass_writes_every_policy_and_the_next_writes_nothing() -> None:
    policies, api, _, _ = keeper()
    await policies.reconcile()
    assert sorted(api.calls) == [("create", policy_name(s)) for s in SERVERS]
    api.calls.clear()
    await policies.reconcile()
    assert api.calls == []


async def test_a_holders_new_address_rewrites_only_its_servers_policy() -> None:
    policies, api, pods, _ = keeper()
    await policies.reconcile()
    api.calls.clear()
    moved = holder(2, ip="10.9.9.9")
    policies.pod_changed(pods.put(moved), moved)
    await policies.reconcile()
    assert api.calls == [("update", policy_name("gpu-2"))]
    assert "10.9.9.9/32" in str(api.stored[policy_name("gpu-2")]["spec"])


async def test_a_finished_holder_leaves_its_policy_at_once() -> None:
    policies, api, pods, _ = keeper()
    await policies.reconcile()
    done = dataclasses.replace(holder(1), phase="Succeeded")
    policies.pod_changed(pods.put(done), done)
    await policies.reconcile()
    ingress = api.stored[policy_name("gpu-1")]["spec"]["ingress"]
    assert len(ingress) == 1 and "ipBlock" not in str(ingress)


async def test_a_pass_nothing_asked_for_looks_at_every_server() -> None:
    policies, api, _, _ = keeper()
    await policies.reconcile()
    # The cache believes a policy that says something else, and no event said so.
    name = policy_name("gpu-3")
    wrong = read_policy({**api.stored[name], "spec": {"podSelector": {}}})
    assert isinstance(wrong, PolicyRecord)
    policies._known[name] = wrong
    api.calls.clear()
    await policies.reconcile()
    assert api.calls == []  # an event-driven pass looks only where events pointed
    policies._full = True  # what the periodic pass sets
    await policies.reconcile()
    assert api.calls == [("update", name)]


async def test_a_server_gone_and_free_loses_its_policy_and_a_held_one_keeps_it() -> None:
    policies, api, _, ledger = keeper()
    await policies.reconcile()
    api.calls.clear()
    free = ledger.lease("gpu-1")
    assert free is not None
    ledger.apply(dataclasses.replace(free, claims=(), resource_version="2"))
    view = policies._discovery.view
    assert view is not None
    policies._discovery.view = view.with_fleet(
        tk.fleet(servers=[tk.server(name="gpu-3")], revision=2)
    )
    await policies.reconcile()
    assert api.calls == [("delete", policy_name("gpu-1"))]
