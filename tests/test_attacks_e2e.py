"""The security issue's attacks, tried against the running stack (`rgpu up --sim`'s processes,
authenticated as k8s/ deploys them): each must fail with a clear 4xx while a real GPU pod still
gets a server. The unit-level variants live beside each service; this file proves the listeners
and the apiserver path as an attacker meets them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rgpu_cli.stack import Stack, StackOptions, run_stack
from rgpu_kubesim.kubelet import (
    DIAL_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    Dialed,
    KubeletConfig,
    RunRecord,
)
from rgpu_testkit import allocation_request, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(180)]

FORGED = {
    "hami.io/remote-gpu-devices-allocated": "gpu-01/GPU-0,RemoteGPU,40000,100:;",
    "hami.io/remote-gpu-devices-to-allocate": "gpu-01/GPU-0,RemoteGPU,40000,100:;",
    "hami.io/lupine-endpoint": "10.0.0.1:14833",
}


def _pod(name: str, *, gpus: int = 0, **spec: Any) -> dict[str, Any]:
    limits = {"nvidia.com/remote-gpu": str(gpus)} if gpus else {}
    container = {"name": "main", "image": "busybox", "resources": {"limits": limits}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [container], **spec},
    }


def _webhook_base(stack: Stack) -> str:
    return stack.webhook_url.removesuffix("/mutate")


async def test_every_attack_of_the_security_issue_fails_against_the_running_stack() -> None:
    options = StackOptions(
        servers=2, cards=2, clients=2, seed=5, kubelet=KubeletConfig(start_delay_seconds=0.1)
    )
    async with run_stack(options) as stack, httpx.AsyncClient(verify=False, timeout=10) as out:
        webhook = _webhook_base(stack)
        # The webhook listener is open to the cluster: it must not book anything.
        for verb in ("/filter", "/prioritize", "/bind"):
            assert (await out.post(webhook + verb, json={})).status_code == 404, verb
        # A pod that asks for nothing but carries a forged allocation and a preset node.
        forged = _pod("forged", schedulerName="rgpu-scheduler", nodeName="client-01")
        forged["metadata"]["annotations"] = FORGED
        refused = await stack.create_pod(forged, user="mallory")
        assert refused.status_code == 403, refused.text
        assert "hami.io/" in refused.json()["message"]
        # The same, as a service account of the system namespace (no wildcard trust).
        as_sa = await stack.create_pod(forged, user="system:serviceaccount:rgpu-system:default")
        assert as_sa.status_code == 403, as_sa.text
        # Writes to the allocator and discovery's probe need a token the apiserver confirms.
        ask = allocation_request(candidates=("client-01",)).to_dict()
        book = await out.post(stack.url("allocator") + "/v1/allocations", json=ask)
        assert book.status_code == 401, book.text
        probe = await out.post(stack.url("discovery") + "/v1/servers/gpu-01/probe")
        assert probe.status_code == 401, probe.text
        # Bounded input: thousands of digits, an oversized body, a 70,000-character uid.
        huge = "9" * 5000
        for url in (stack.url("allocator") + "/v1/claims", stack.url("discovery") + "/v1/fleet"):
            assert (await out.get(url, params={"since": huge})).status_code == 400, url
        big = await out.post(webhook + "/mutate", content=b"{" + b" " * (16 << 20) + b"}")
        assert big.status_code == 413, big.status_code
        uid = await out.post(
            stack.url("extender") + "/bind",
            json={"PodName": "p", "PodNamespace": "default", "PodUID": "u" * 70000, "Node": "n"},
        )
        assert uid.status_code == 200 and uid.json()["Error"], uid.text
        # And the system still serves the honest: a GPU pod is admitted, bound and run.
        honest = await stack.create_pod(_pod("honest", gpus=1))
        assert honest.status_code == 201, honest.text
        await eventually(
            lambda: any(r.key == "default/honest" for r in stack.kubelet.records.values()),
            timeout=60,
            what="the honest GPU pod started",
        )
        for service in ("discovery", "allocator", "extender", "metrics"):
            assert (await out.get(stack.url(service) + "/readyz")).status_code == 200, service


async def test_a_pod_going_to_a_servers_lupine_it_does_not_hold_is_refused_by_the_network() -> None:
    """lupine has no access control: without server policies any pod that learns a server's
    endpoint uses it. With them (on a cluster that enforces NetworkPolicy), only the holder's
    address gets through, and discovery keeps probing."""
    options = StackOptions(
        servers=2,
        cards=2,
        clients=2,
        seed=5,
        kubelet=KubeletConfig(start_delay_seconds=0.1),
        server_policies=True,
    )
    async with run_stack(options) as stack, httpx.AsyncClient(timeout=10) as out:
        holder = _pod("holder", gpus=1)
        holder["metadata"]["annotations"] = {RUN_SECONDS_ANNOTATION: "600"}
        assert (await stack.create_pod(holder)).status_code == 201

        def running(key: str) -> RunRecord | None:
            found = [r for r in stack.kubelet.records.values() if r.key == key]
            return found[0] if found and found[0].gpus else None

        await eventually(lambda: running("default/holder"), timeout=60, what="the holder ran")
        record = running("default/holder")
        assert record is not None and record.phase == "Running", record
        lupine = stack.fleet.lupine.by_endpoint(record.endpoint)
        assert lupine.clients[record.uid].address == record.address
        # A pod that asked for nothing copies the holder's endpoint: the network resets it.
        copycat = _pod("copycat", nodeName=stack.fleet.plan.clients[0].name)
        copycat["metadata"]["annotations"] = {DIAL_ANNOTATION: record.endpoint}
        assert (await stack.create_pod(copycat)).status_code == 201
        await eventually(
            lambda: any(
                r.key == "default/copycat" and r.dials for r in stack.kubelet.records.values()
            ),
            timeout=60,
            what="the copycat dialled",
        )
        (copied,) = [r for r in stack.kubelet.records.values() if r.key == "default/copycat"]
        assert copied.dials == {record.endpoint: "reset"}
        assert await stack.kubelet.dial(copied.uid, record.endpoint) is Dialed.RESET
        assert await stack.kubelet.dial(record.uid, record.endpoint) is Dialed.CONNECTED
        assert stack.network is not None
        assert any(r.source_pod == "default/copycat" for r in stack.network.refusals)
        # Discovery still probes every server: none is reported unreachable.
        fleet = (await out.get(stack.url("discovery") + "/v1/fleet")).json()
        assert all(s["reachable"] for s in fleet["servers"]), fleet
