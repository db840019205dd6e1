"""Attacks on the extender, tried as an attacker would: over its real listeners (TLS webhook,
scheduler listener with and without a client certificate) and through a real apiserver that
calls the webhook for every pod (no matchConditions: the extender must be right on its own).

Each test states the refusal the attack must meet; none may end in a 5xx or a dropped
connection, and the extender keeps serving afterwards.
"""

from __future__ import annotations

import copy
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trustme

from rgpu_kubesim import SimApiServer, run_apiserver

pytestmark = pytest.mark.anyio

Json = dict[str, Any]
FORGED = "gpu-node-2/GPU-gpu-node-2-0,RemoteGPU,40960,100:;"
ALLOCATED = "hami.io/remote-gpu-devices-allocated"
ENDPOINT = "hami.io/lupine-endpoint"
ALLOCATOR_SA = "system:serviceaccount:rgpu-system:rgpu-allocator"
PODS = "/api/v1/namespaces/ml-team/pods"


def trusting(ca: trustme.CA, client: trustme.LeafCert | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if client is not None:
        client.configure_cert(context)
    return context


def new_pod(build, *containers: Json, name: str = "trainer-0", **spec: Any) -> Json:
    the_pod: Json = build.pod(*containers, name=name, **spec)
    del the_pod["metadata"]["uid"]
    return the_pod


@asynccontextmanager
async def admitting_cluster(
    serve_extender, webhook_configuration, **env: str
) -> AsyncIterator[tuple[SimApiServer, httpx.AsyncClient]]:
    """An apiserver that sends every pod CREATE and UPDATE to the served extender's webhook."""
    # The cluster is entered after the extender, so it closes its webhook connections first.
    async with (
        serve_extender(**env) as (_, webhook),
        run_apiserver() as cluster,
        httpx.AsyncClient(base_url=cluster.url, trust_env=False) as kube,
    ):
        cluster.store.create("namespaces", {"metadata": {"name": "ml-team"}})
        # Service accounts may edit pods in ml-team, so what refuses them below is the webhook's
        # trust, not RBAC (tests/test_attacks_rbac_e2e.py attacks RBAC itself).
        cluster.store.create("rolebindings", ACCOUNTS_EDIT, namespace="ml-team")
        config = webhook_configuration(webhook, ["CREATE", "UPDATE"])
        cluster.store.create("mutatingwebhookconfigurations", config)
        yield cluster, kube


ACCOUNTS_EDIT = {
    "metadata": {"name": "service-accounts-edit"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
    "subjects": [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:serviceaccounts"}
    ],
}


def as_user(user: str, content_type: str = "application/json") -> dict[str, str]:
    return {"x-sim-user": user, "content-type": content_type}


# -- the verbs are not reachable where the cluster network can reach -----------------------------


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind"])
async def test_scheduler_verbs_are_not_served_on_the_webhook_listener(
    serve_extender, ca, build, allocator, path: str
) -> None:
    args = build.filter_args(build.pod(), ["cpu-node-1"])
    binding = {"PodName": "trainer-0", "PodNamespace": "ml-team", "PodUID": "u", "Node": "c"}
    body = binding if path == "/bind" else args
    async with (
        serve_extender() as (_, webhook),
        httpx.AsyncClient(verify=trusting(ca), trust_env=False) as client,
    ):
        reply = await client.post(f"{webhook}{path}", json=body)
        assert reply.status_code == 404
        assert "on the extender's webhook listener" in reply.json()["message"]
        assert (await client.get(f"{webhook}/metrics")).status_code == 404
        assert (await client.get(f"{webhook}/readyz")).status_code == 200
    assert allocator.requests == [] and allocator.commits == []


async def test_the_webhook_is_not_served_on_the_scheduler_listener(serve_extender, build) -> None:
    async with serve_extender() as (scheduler, _), httpx.AsyncClient(trust_env=False) as client:
        reply = await client.post(f"{scheduler}/mutate", json=build.review(build.pod()))
        assert reply.status_code == 404
        assert (await client.get(f"{scheduler}/metrics")).status_code == 200


@pytest.fixture(scope="session")
def client_ca() -> trustme.CA:
    """The CA that signs kube-scheduler's client certificate."""
    return trustme.CA()


@pytest.fixture
def client_ca_file(client_ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "scheduler-ca.crt"
    client_ca.cert_pem.write_to_path(path)
    return str(path)


async def test_scheduler_listener_refuses_a_client_without_a_certificate_when_a_ca_is_set(
    serve_extender, ca, client_ca, client_ca_file, build
) -> None:
    args = build.filter_args(build.pod(), ["cpu-node-1"])
    scheduler_cert = client_ca.issue_cert("kube-scheduler")
    stranger = trustme.CA().issue_cert("kube-scheduler")
    async with serve_extender(RGPU_SCHEDULER_CLIENT_CA_FILE=client_ca_file) as (scheduler, _):
        assert scheduler.startswith("https://")
        for context in (trusting(ca), trusting(ca, stranger)):
            async with httpx.AsyncClient(verify=context, trust_env=False) as anonymous:
                with pytest.raises(httpx.TransportError):
                    await anonymous.post(f"{scheduler}/filter", json=args)
        async with httpx.AsyncClient(
            verify=trusting(ca, scheduler_cert), trust_env=False
        ) as kube_scheduler:
            reply = await kube_scheduler.post(f"{scheduler}/filter", json=args)
            assert reply.status_code == 200
            assert reply.json()["NodeNames"] == ["cpu-node-1"]


# -- scheduler-owned annotations, through the apiserver ------------------------------------------


async def test_a_pod_asking_for_nothing_cannot_carry_a_forged_allocation(
    serve_extender, webhook_configuration, build
) -> None:
    forged = new_pod(
        build,
        build.container("sleeper"),
        name="squatter",
        nodeName="cpu-node-1",
        scheduler="rgpu-scheduler",
    )
    forged["metadata"]["annotations"] = {ALLOCATED: FORGED, ENDPOINT: "10.0.3.50:14833"}
    async with admitting_cluster(serve_extender, webhook_configuration) as (cluster, kube):
        reply = await kube.post(PODS, json=forged, headers=as_user("mallory"))
        assert reply.status_code == 403, reply.text
        message = reply.json()["message"]
        assert ALLOCATED in message and ENDPOINT in message
        assert "remove them from metadata.annotations" in message
        assert cluster.store.list("pods", namespace="ml-team") == []


@pytest.mark.parametrize("user", ["system:serviceaccount:rgpu-system:default", "mallory"])
async def test_only_the_exact_trusted_users_may_add_owned_annotations_to_a_bound_pod(
    serve_extender, webhook_configuration, build, user: str
) -> None:
    # The pod is bound straight away, as in HAMi's flow (a gated pod could not be bound).
    async with admitting_cluster(
        serve_extender,
        webhook_configuration,
        RGPU_TRUSTED_USERS=ALLOCATOR_SA,
        RGPU_ADMISSION="filter",
    ) as (cluster, kube):
        created = await kube.post(PODS, json=new_pod(build, build.container(count="1")))
        assert created.status_code == 201, created.text
        binding = {
            "target": {"kind": "Node", "name": "cpu-node-1"},
            "metadata": {"name": "trainer-0"},
        }
        bound = await kube.post(f"{PODS}/trainer-0/binding", json=binding)
        assert bound.status_code == 201, bound.text
        patch = {"metadata": {"annotations": {ENDPOINT: "10.6.6.6:14833"}}}
        merge = as_user(user, "application/merge-patch+json")
        refused = await kube.patch(f"{PODS}/trainer-0", json=patch, headers=merge)
        assert refused.status_code == 403, refused.text
        assert user in refused.json()["message"] and ENDPOINT in refused.json()["message"]
        nudge = {"metadata": {"annotations": {"rgpu.io/retry-at": "1"}}}
        trusted = as_user(ALLOCATOR_SA, "application/merge-patch+json")
        allowed = await kube.patch(f"{PODS}/trainer-0", json=nudge, headers=trusted)
        assert allowed.status_code == 200, allowed.text
        stored = cluster.store.get("pods", "trainer-0", namespace="ml-team")
        assert ENDPOINT not in stored["metadata"].get("annotations", {})


async def test_a_json_patch_with_an_escaped_annotation_key_is_seen_and_refused(
    serve_extender, webhook_configuration, build
) -> None:
    async with admitting_cluster(serve_extender, webhook_configuration) as (_, kube):
        plain = new_pod(build, build.container("web"), name="web")
        plain["metadata"]["annotations"] = {"team": "ml"}
        assert (await kube.post(PODS, json=plain)).status_code == 201
        ops = [
            {"op": "add", "path": "/metadata/annotations/hami.io~1lupine-endpoint", "value": "x"},
            {"op": "add", "path": "/metadata/annotations/rgpu.io~1claims", "value": "[]"},
        ]
        headers = as_user(
            "system:serviceaccount:rgpu-system:default", "application/json-patch+json"
        )
        refused = await kube.patch(f"{PODS}/web", content=orjson.dumps(ops), headers=headers)
        assert refused.status_code == 403, refused.text
        assert f"{ENDPOINT}, rgpu.io/claims" in refused.json()["message"]


async def test_an_ephemeral_container_cannot_ask_for_a_remote_gpu(
    serve_extender, webhook_configuration, build
) -> None:
    debug = build.container("debug", count="1", wired=False)
    sneaky = new_pod(build, build.container("web"), name="web", ephemeralContainers=[debug])
    async with admitting_cluster(serve_extender, webhook_configuration) as (_, kube):
        refused = await kube.post(PODS, json=sneaky)
        assert refused.status_code == 403, refused.text
        assert "spec.ephemeralContainers[0] asks for nvidia.com/remote-gpu" in refused.text


async def test_a_gpu_pod_for_the_default_scheduler_with_a_preset_node_is_refused(
    serve_extender, webhook_configuration, build
) -> None:
    pinned = new_pod(build, build.container(count="1"), nodeName="cpu-node-1")
    pinned["spec"]["schedulerName"] = "default-scheduler"
    async with admitting_cluster(serve_extender, webhook_configuration) as (cluster, kube):
        refused = await kube.post(PODS, json=pinned)
        assert refused.status_code == 403, refused.text
        assert "spec.nodeName='cpu-node-1'" in refused.json()["message"]
        unpinned = copy.deepcopy(pinned)
        del unpinned["spec"]["nodeName"]
        assert (await kube.post(PODS, json=unpinned)).status_code == 201
        stored = cluster.store.get("pods", "trainer-0", namespace="ml-team")
        assert stored["spec"]["schedulerName"] == "rgpu-scheduler"


# -- malformed and oversized input on the real listeners -----------------------------------------


@asynccontextmanager
async def both_clients(
    serve_extender, ca: trustme.CA
) -> AsyncIterator[tuple[Callable[..., Any], Callable[..., Any]]]:
    """POST helpers for the scheduler listener and the webhook listener."""
    async with (
        serve_extender() as (scheduler, webhook),
        httpx.AsyncClient(base_url=scheduler, trust_env=False, timeout=30) as sched,
        httpx.AsyncClient(base_url=webhook, verify=trusting(ca), trust_env=False) as hook,
    ):
        yield sched.post, hook.post
        assert (await sched.get("/readyz")).status_code == 200
        assert (await hook.get("/healthz")).status_code == 200


async def test_a_quantity_of_thousands_of_digits_is_refused_not_a_500(
    serve_extender, ca, build
) -> None:
    greedy = build.pod(build.container(count="9" * 5000))
    async with both_clients(serve_extender, ca) as (scheduler, webhook):
        filtered = await scheduler("/filter", json=build.filter_args(greedy, ["cpu-node-1"]))
        assert filtered.status_code == 200
        unresolvable = filtered.json()["FailedAndUnresolvableNodes"]["cpu-node-1"]
        assert "is larger than 2147483647" in unresolvable
        reviewed = await webhook("/mutate", json=build.review(greedy))
        assert reviewed.status_code == 200
        assert "is larger than 2147483647" in reviewed.json()["response"]["status"]["message"]


async def test_an_env_name_that_is_a_list_is_a_400_denial_naming_the_field(
    serve_extender, ca, build
) -> None:
    odd = build.pod(build.container(count="1", env=[{"name": ["LUPINE_SERVER"], "value": "x"}]))
    async with both_clients(serve_extender, ca) as (_, webhook):
        reply = await webhook("/mutate", json=build.review(odd))
        assert reply.status_code == 200
        status = reply.json()["response"]["status"]
        assert status["code"] == 400
        assert status["message"].startswith("spec.containers[0].env[0].name: expected a string")


async def test_a_70000_character_pod_uid_is_refused_by_bind_and_prioritize(
    serve_extender, ca, build, allocator
) -> None:
    uid = "u" * 70_000
    binding = {"PodName": "trainer-0", "PodNamespace": "ml-team", "PodUID": uid, "Node": "c"}
    args = build.filter_args(build.pod(uid=uid), ["cpu-node-1"])
    async with both_clients(serve_extender, ca) as (scheduler, _):
        bound = await scheduler("/bind", json=binding)
        assert bound.status_code == 200
        assert "PodUID: is 70000 characters long" in bound.json()["Error"]
        scored = await scheduler("/prioritize", json=args)
        assert scored.status_code == 400
        assert "Pod.metadata.uid: is 70000 characters long" in scored.json()["message"]
    assert allocator.commits == []


def nested(depth: int) -> Json:
    value: Json = {}
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_deeply_nested_objects_are_refused_not_echoed_into_a_500(
    serve_extender, ca, build
) -> None:
    node = {"metadata": {"name": "cpu-node-1"}, "spec": nested(300)}
    args = {"Pod": build.pod(build.container()), "Nodes": {"items": [node]}, "NodeNames": None}
    deep_env = [{"name": "X", "valueFrom": nested(300)}]
    review = build.review(build.pod(build.container(count="1", env=deep_env)))
    async with both_clients(serve_extender, ca) as (scheduler, webhook):
        filtered = await scheduler("/filter", json=args)
        assert filtered.status_code == 200
        assert "Nodes: nests deeper than 64 levels" in filtered.json()["Error"]
        reviewed = await webhook("/mutate", json=review)
        assert reviewed.status_code == 400
        assert "request.object: nests deeper than 64 levels" in reviewed.json()["message"]


def sixteen_mib() -> bytes:
    return b'{"padding": "' + b"x" * (16 << 20) + b'"}'


async def test_a_16_mib_review_is_refused_with_413_and_the_webhook_keeps_serving(
    serve_extender, ca, build
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        body = sixteen_mib()
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    async with both_clients(serve_extender, ca) as (_, webhook):
        declared = await webhook("/mutate", content=sixteen_mib())
        assert declared.status_code == 413
        assert "request body exceeds" in declared.json()["message"]
        streamed = await webhook("/mutate", content=chunks())
        assert streamed.status_code == 413
        after = await webhook("/mutate", json=build.review(build.pod()))
        assert after.status_code == 200 and after.json()["response"]["allowed"] is True


async def test_an_oversized_filter_or_bind_is_answered_200_with_error(serve_extender, ca) -> None:
    async with both_clients(serve_extender, ca) as (scheduler, _):
        for verb in ("/filter", "/bind"):
            reply = await scheduler(verb, content=sixteen_mib())
            assert reply.status_code == 200
            assert "request body exceeds" in reply.json()["Error"]
        scored = await scheduler("/prioritize", content=sixteen_mib())
        assert scored.status_code == 413


async def test_a_content_length_of_thousands_of_digits_is_a_413(extender, build) -> None:
    body = orjson.dumps(build.review(build.pod()))
    headers = {"content-type": "application/json", "content-length": "9" * 5000}
    reply = await extender.client.post("/mutate", content=body, headers=headers)
    assert reply.status_code == 413
