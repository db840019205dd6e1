"""lupine has no access control, so pointing a container at someone else's server is the attack
behind every other: tried here through a real apiserver calling the webhook (for pods and for
pods/status, as k8s/ registers it), and at the webhook's boundary for what the simulated
apiserver does not serve (pods/ephemeralcontainers).

A container that asks for no remote GPU may not name a lupine server, however the variable is
set; owned annotations stay guarded when they arrive through pods/status.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from rgpu_extender.admission import AdmissionPolicy, decide
from rgpu_extender.settings import ExtenderSettings
from rgpu_kubesim import SimApiServer, run_apiserver

pytestmark = pytest.mark.anyio

Json = dict[str, Any]
PODS = "/api/v1/namespaces/ml-team/pods"
ENDPOINT = "hami.io/lupine-endpoint"
LITERAL = {"name": "LUPINE_SERVER", "value": "10.0.3.77:14833"}


@asynccontextmanager
async def cluster_with_webhook(
    serve_extender, webhook_configuration: Callable[[str, list[str]], Json]
) -> AsyncIterator[tuple[SimApiServer, httpx.AsyncClient]]:
    """An apiserver that sends every pod CREATE/UPDATE and every pods/status UPDATE."""
    async with (
        serve_extender() as (_, webhook),
        run_apiserver() as cluster,
        httpx.AsyncClient(base_url=cluster.url, trust_env=False) as kube,
    ):
        cluster.store.create("namespaces", {"metadata": {"name": "ml-team"}})
        config = webhook_configuration(webhook, ["CREATE", "UPDATE"])
        (hook,) = config["webhooks"]
        status = copy.deepcopy(hook) | {"name": "pods-status.rgpu.io"}
        status["rules"][0] |= {"operations": ["UPDATE"], "resources": ["pods/status"]}
        config["webhooks"].append(status)
        cluster.store.create("mutatingwebhookconfigurations", config)
        yield cluster, kube


STATUS_WRITER = (
    (
        "roles",
        {
            "metadata": {"name": "pod-status-writer"},
            "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["update"]}],
        },
    ),
    (
        "rolebindings",
        {
            "metadata": {"name": "mallory-pod-status-writer"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-status-writer",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}
            ],
        },
    ),
)


def new_pod(build, *containers: Json, name: str = "trainer-0") -> Json:
    the_pod: Json = build.pod(*containers, name=name)
    del the_pod["metadata"]["uid"]
    return the_pod


async def test_a_pod_asking_for_nothing_may_not_name_a_lupine_server(
    serve_extender, webhook_configuration, build
) -> None:
    squatter = new_pod(build, build.container("app", env=[LITERAL]), name="squatter")
    async with cluster_with_webhook(serve_extender, webhook_configuration) as (cluster, kube):
        refused = await kube.post(PODS, json=squatter)
        assert refused.status_code == 403, refused.text
        message = refused.json()["message"]
        assert "container 'app' (spec.containers[0]) sets LUPINE_SERVER" in message
        assert "asks for no nvidia.com/remote-gpu" in message
        assert "Remove LUPINE_SERVER from that container" in message
        assert cluster.store.list("pods", namespace="ml-team") == []


@pytest.mark.parametrize(
    "sidecar_env",
    [
        [LITERAL],
        [{"name": "LUPINE_SERVER", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
        [{"name": "LUPINE_SERVER_ADDR", "value": "10.0.3.77"}],
    ],
    ids=["literal", "from-a-configmap", "another-lupine-variable"],
)
async def test_a_sidecar_of_a_gpu_pod_may_not_name_a_lupine_server(
    serve_extender, webhook_configuration, build, sidecar_env: list[Json]
) -> None:
    pod = new_pod(build, build.container(count="1"), build.container("sidecar", env=sidecar_env))
    async with cluster_with_webhook(serve_extender, webhook_configuration) as (_, kube):
        refused = await kube.post(PODS, json=pod)
        assert refused.status_code == 403, refused.text
        assert "container 'sidecar' (spec.containers[1])" in refused.json()["message"]


async def test_an_envfrom_prefix_of_lupine_is_refused_in_a_container_asking_for_nothing(
    serve_extender, webhook_configuration, build
) -> None:
    sidecar = build.container(
        "sidecar", envFrom=[{"prefix": "LUPINE_", "configMapRef": {"name": "c"}}]
    )
    async with cluster_with_webhook(serve_extender, webhook_configuration) as (_, kube):
        refused = await kube.post(PODS, json=new_pod(build, build.container(count="1"), sidecar))
        assert refused.status_code == 403, refused.text
        assert "envFrom prefix LUPINE_" in refused.json()["message"]


async def test_the_requesting_container_gets_its_own_endpoint_and_the_workload_id_is_harmless(
    serve_extender, webhook_configuration, build
) -> None:
    asking = build.container(count="1", env=[LITERAL])
    sidecar = build.container("sidecar", env=[{"name": "LUPINE_WORKLOAD_ID", "value": "x"}])
    async with cluster_with_webhook(serve_extender, webhook_configuration) as (cluster, kube):
        created = await kube.post(PODS, json=new_pod(build, asking, sidecar))
        assert created.status_code == 201, created.text
        stored = cluster.store.get("pods", "trainer-0", namespace="ml-team")
        (server,) = [
            e for e in stored["spec"]["containers"][0]["env"] if e["name"] == "LUPINE_SERVER"
        ]
        assert "value" not in server
        assert server["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{ENDPOINT}']"


async def test_owned_annotations_written_through_pods_status_are_refused(
    serve_extender, webhook_configuration, build
) -> None:
    async with cluster_with_webhook(serve_extender, webhook_configuration) as (cluster, kube):
        created = await kube.post(PODS, json=new_pod(build, build.container(count="1")))
        assert created.status_code == 201, created.text
        current = (await kube.get(f"{PODS}/trainer-0")).json()
        current["metadata"]["annotations"] = {**current["metadata"].get("annotations", {})}
        current["metadata"]["annotations"][ENDPOINT] = "10.6.6.6:14833"
        # mallory's RBAC lets her write pods/status (kube's edit does not), so what refuses her
        # below is the webhook, not RBAC.
        for plural, grant in STATUS_WRITER:
            cluster.store.create(plural, grant, namespace="ml-team")
        headers = {"x-sim-user": "mallory"}
        refused = await kube.put(f"{PODS}/trainer-0/status", json=current, headers=headers)
        assert refused.status_code == 403, refused.text
        assert ENDPOINT in refused.json()["message"] and "mallory" in refused.json()["message"]
        stored = cluster.store.get("pods", "trainer-0", namespace="ml-team")
        assert ENDPOINT not in stored["metadata"].get("annotations", {})


def test_an_ephemeral_container_naming_a_lupine_server_is_refused(build) -> None:
    # The simulated apiserver has no pods/ephemeralcontainers; the webhook is judged directly.
    old = build.pod()
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox", "env": [LITERAL]}]
    review = build.review(new, operation="UPDATE", old=old)
    review["request"]["subResource"] = "ephemeralcontainers"
    policy = AdmissionPolicy.from_settings(ExtenderSettings.from_env({}))
    decision = decide(review, policy)
    assert decision.allowed is False
    assert "container 'debug' (spec.ephemeralContainers[0]) sets LUPINE_SERVER" in decision.message
