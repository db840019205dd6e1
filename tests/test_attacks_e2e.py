"""The security issue's attacks, tried against the running stack (`rgpu up --sim`'s processes,
authenticated as k8s/ deploys them): each must fail with a clear 4xx while a real GPU pod still
gets a server. The unit-level variants live beside each service; this file proves the listeners
and the apiserver path as an attacker meets them."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any

import anyio
import httpx
import orjson
import pytest

from rgpu_kubesim.kubelet import (
    DIAL_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    Dialed,
    KubeletConfig,
    RunRecord,
    dial,
)
from rgpu_sim.stack import SERVICES, Stack, StackOptions, run_stack
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
        # The scheduler listener answers only kube-scheduler's client certificate: anyone else
        # who reaches it is refused at the handshake, before /bind or /filter can act.
        bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "u" * 70000, "Node": "n"}
        with pytest.raises(httpx.TransportError):
            await out.post(stack.url("extender") + "/bind", json=bind)
        async with httpx.AsyncClient(verify=stack.scheduler_tls, timeout=10) as scheduler:
            uid = await scheduler.post(stack.url("extender") + "/bind", json=bind)
        assert uid.status_code == 200 and uid.json()["Error"], uid.text
        # And the system still serves the honest: a GPU pod is admitted, bound and run.
        honest = await stack.create_pod(_pod("honest", gpus=1))
        assert honest.status_code == 201, honest.text
        await eventually(
            lambda: any(r.key == "default/honest" for r in stack.kubelet.records.values()),
            timeout=60,
            what="the honest GPU pod started",
        )
        async with httpx.AsyncClient(verify=stack.scheduler_tls, timeout=10) as probe:
            for service in SERVICES:
                assert (await probe.get(stack.url(service) + "/readyz")).status_code == 200


# -- the listeners and the tokens behind them ------------------------------------------------------


def _flood_headers(url: str, mib: int, context: ssl.SSLContext) -> bytes:
    """Send a request head of ``mib`` MiB (over ``context`` for https) and read what comes
    back."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=30)
    with raw if url.startswith("http:") else context.wrap_socket(raw, server_hostname=host) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(b"GET /readyz HTTP/1.1\r\nhost: x\r\nx-pad: ")
            chunk = b"a" * (1 << 20)
            for _ in range(mib):
                sock.sendall(chunk)
        received = b""
        with contextlib.suppress(OSError):
            while part := sock.recv(65536):
                received += part
        return received


async def _drip(port: int, sources: list[str], per_source: int) -> list[asyncio.StreamWriter]:
    """Connections that send one byte of a TLS handshake and nothing more."""
    writers = []
    for source in sources:
        for _ in range(per_source):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            except OSError:
                continue
            writer.write(b"\x16")
            writers.append(writer)
    return writers


def _sample(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _token(stack: Stack, account: str, audience: str) -> str:
    path = f"/api/v1/namespaces/rgpu-system/serviceaccounts/{account}/token"
    answer = await stack.apiserver.post(path, json={"spec": {"audiences": [audience]}})
    assert answer.status_code == 201, answer.text
    token: str = answer.json()["status"]["token"]
    return token


async def test_listener_floods_token_replays_and_lupine_squatters_fail_while_honest_pods_pass() -> (
    None
):
    limits = {"RGPU_HTTP_HEADER_SECONDS": "3"}
    options = StackOptions(
        servers=2,
        cards=2,
        clients=2,
        seed=7,
        kubelet=KubeletConfig(start_delay_seconds=0.1),
        extra_env=dict.fromkeys(SERVICES, limits),
    )
    async with (
        run_stack(options) as stack,
        httpx.AsyncClient(verify=stack.scheduler_tls, timeout=30) as out,
    ):
        webhook = _webhook_base(stack)
        extender_metrics = stack.url("extender") + "/metrics"
        # Header floods of 16, 64 and 128 MiB on every listener: cut at 64 KiB with a 431.
        listeners = [webhook, *(stack.url(s) for s in SERVICES)]
        for url in listeners:
            for mib in (16, 64, 128):
                tls = stack.scheduler_tls  # trusts the CA; the client certificate where needed
                reply = await anyio.to_thread.run_sync(_flood_headers, url, mib, tls)
                assert reply == b"" or reply.startswith(b"HTTP/1.1 431 "), (url, reply[:80])
        text = (await out.get(extender_metrics)).text
        assert _sample(text, "rgpu_http_rejected_total", listener="webhook", reason="header_bytes")
        # Thousands of connections dripping a handshake, from three addresses: each address is
        # held to its cap, the rest are closed at accept, and an honest pod still gets through.
        port = int(webhook.rsplit(":", 1)[1])
        writers = await _drip(port, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], 700)
        try:
            during = await stack.create_pod(_pod("during-drip", gpus=1))
            assert during.status_code == 201, during.text
            text = (await out.get(extender_metrics)).text
            assert _sample(text, "rgpu_http_connections", listener="webhook") <= 3 * 256 + 16
            refused = _sample(
                text, "rgpu_http_rejected_total", listener="webhook", reason="client_connections"
            )
            assert refused >= 3 * 700 - 3 * 256 - 64, refused
            # The dripping ones are cut at the deadline (3 s here), TLS never finished.
            await eventually(
                lambda: _dripped_away(out, extender_metrics),
                timeout=30,
                what="the dripping connections cut at their deadline",
            )
        finally:
            for writer in writers:
                writer.close()
        # The review of a pod with 1.5 million containers (4.3 MiB, within the body the webhook
        # reads) is refused by its shape before it is decoded, in-band.
        crowd = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "7c1e6c1a-5e8b-4f57-9a3b-0a1b2c3d4e5f",
                "operation": "CREATE",
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "object": {"spec": {"containers": [{}] * 1_500_000}},
            },
        }
        reply = await out.post(webhook + "/mutate", content=orjson.dumps(crowd))
        assert reply.status_code == 200, reply.text[:300]
        assert reply.json()["response"]["allowed"] is False
        assert "JSON values" in reply.json()["response"]["status"]["message"]
        # One audience per receiving service, one allow-list per route.
        fleet = (await out.get(stack.url("discovery") + "/v1/fleet")).json()
        server = fleet["servers"][0]["name"]
        probe_url = stack.url("discovery") + f"/v1/servers/{server}/probe"
        allocators = await _token(stack, "rgpu-allocator", "rgpu-discovery")
        as_discovery_receives = {"Authorization": f"Bearer {allocators}"}
        assert (await out.post(probe_url, headers=as_discovery_receives)).status_code == 200
        ask = allocation_request(candidates=("client-01",)).to_dict()
        replayed = await out.post(
            stack.url("allocator") + "/v1/allocations", json=ask, headers=as_discovery_receives
        )
        assert replayed.status_code == 401, replayed.text
        released = await out.delete(
            stack.url("allocator") + "/v1/allocations/some-uid", headers=as_discovery_receives
        )
        assert released.status_code == 401, released.text
        extenders = {
            "Authorization": f"Bearer {await _token(stack, 'rgpu-extender', 'rgpu-allocator')}"
        }
        assert (await out.post(probe_url, headers=extenders)).status_code == 401
        minted = await _token(stack, "rgpu-extender", "rgpu-discovery")
        probed = await out.post(probe_url, headers={"Authorization": f"Bearer {minted}"})
        assert probed.status_code == 403, probed.text
        assert "RGPU_PROBE_CALLERS" in probed.json()["message"]
        # A pod (or a sidecar) that asks for nothing may not point at a lupine server.
        squatter = _pod("squatter")
        squatter["spec"]["containers"][0]["env"] = [
            {"name": "LUPINE_SERVER", "value": "10.0.3.77:14833"}
        ]
        refused_pod = await stack.create_pod(squatter, user="mallory")
        assert refused_pod.status_code == 403, refused_pod.text
        assert "sets LUPINE_SERVER but asks for no nvidia.com/remote-gpu" in refused_pod.text
        # Owned annotations arriving through pods/status are refused like any other way in.
        current = (await stack.apiserver.get("/api/v1/namespaces/default/pods/during-drip")).json()
        current["metadata"].setdefault("annotations", {})["hami.io/lupine-endpoint"] = "10.6.6.6:1"
        forged_status = await stack.apiserver.put(
            "/api/v1/namespaces/default/pods/during-drip/status",
            json=current,
            headers={"X-Sim-User": "mallory"},
        )
        assert forged_status.status_code == 403, forged_status.text
        # The honest pod admitted during the drip is bound and runs; every service is ready.
        await eventually(
            lambda: any(r.key == "default/during-drip" for r in stack.kubelet.records.values()),
            timeout=60,
            what="the honest GPU pod started",
        )
        for service in SERVICES:
            assert (await out.get(stack.url(service) + "/readyz")).status_code == 200, service


async def _dripped_away(out: httpx.AsyncClient, metrics_url: str) -> bool:
    text = (await out.get(metrics_url)).text
    cut = _sample(text, "rgpu_http_rejected_total", listener="webhook", reason="tls_handshake")
    return cut >= 3 * 256 - 16 and _sample(text, "rgpu_http_connections", listener="webhook") < 16


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
        await _widened_and_deleted_policies_are_put_back(stack, lupine.name, record, copied)
        # Released: the old holder's address is reset like anyone else's.
        gone = await stack.apiserver.delete("/api/v1/namespaces/default/pods/holder")
        assert gone.status_code == 200, gone.text
        await eventually(
            lambda: _holders(stack, lupine.name) == "", timeout=30, what="the holder left"
        )
        assert await dial(record.endpoint, record.address, timeout=2) is Dialed.RESET


POLICIES = "/apis/networking.k8s.io/v1/namespaces/rgpu-lupine/networkpolicies"


def _holders(stack: Stack, server: str) -> str | None:
    """The holders the server's policy admits, as the store has it (None: no policy)."""
    found = [
        p
        for p in stack.sim.store.list("networkpolicies", namespace="rgpu-lupine")
        if p["metadata"]["name"] == f"rgpu-server-{server}"
    ]
    return found[0]["metadata"]["annotations"]["rgpu.io/holders"] if found else None


async def _widened_and_deleted_policies_are_put_back(
    stack: Stack, server: str, holder: RunRecord, copycat: RunRecord
) -> None:
    """Someone with rights on NetworkPolicies opens the server's policy to every source, then
    deletes it (cutting the holder off: the standing policy admits discovery only). The
    allocator narrows the first and recreates the second; neither lasts."""
    path = f"{POLICIES}/rgpu-server-{server}"
    opened = [{"op": "add", "path": "/spec/ingress/-", "value": {}}]
    widen = await stack.apiserver.patch(
        path, content=orjson.dumps(opened), headers={"Content-Type": "application/json-patch+json"}
    )
    assert widen.status_code == 200, widen.text

    async def narrowed() -> bool:
        rules = (await stack.apiserver.get(path)).json()["spec"]["ingress"]
        return all(rule.get("from") for rule in rules)

    await eventually(narrowed, timeout=30, what="the widened policy narrowed again")
    assert await stack.kubelet.dial(copycat.uid, holder.endpoint) is Dialed.RESET
    assert (await stack.apiserver.delete(path)).status_code == 200
    await eventually(
        lambda: _holders(stack, server) == "default/holder", timeout=30, what="policy put back"
    )
    assert await stack.kubelet.dial(holder.uid, holder.endpoint) is Dialed.CONNECTED
