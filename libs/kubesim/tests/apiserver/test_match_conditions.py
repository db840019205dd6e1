"""matchConditions of mutating webhooks, evaluated with CEL over real HTTP as kube does."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trustme
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_kubesim import ApiOptions
from rgpu_kubesim.apiserver.endpoints._server import listening_socket, serving, socket_url
from rgpu_testkit import binding_manifest

pytestmark = pytest.mark.anyio

Manifest = Any
CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
PODS = "/api/v1/namespaces/default/pods"
BINDINGS = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings"
K8S_WEBHOOK = Path(__file__).resolve().parents[4] / "k8s" / "base" / "extender" / "webhook.yaml"
MARK = {"op": "add", "path": "/metadata/labels", "value": {"webhook": "called"}}

ASKS = (
    "(object.spec.containers"
    " + (has(object.spec.initContainers) ? object.spec.initContainers : []))"
    ".exists(c, has(c.resources)"
    " && [has(c.resources.limits) ? c.resources.limits : {},"
    " has(c.resources.requests) ? c.resources.requests : {}]"
    ".exists(r, 'nvidia.com/remote-gpu' in r || 'nvidia.com/remote-gpu-memory' in r))"
)
OWNED = (
    "[object, oldObject].exists(o, o != null && has(o.metadata.annotations)"
    " && o.metadata.annotations.exists(k, k.startsWith('hami.io/remote-gpu-devices-')"
    " || k == 'hami.io/lupine-endpoint' || k.startsWith('rgpu.io/')))"
)
ASKS_OR_OWNED = f"({ASKS}) || ({OWNED})"


class Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.users: list[dict[str, Any]] = []

    async def handle(self, request: Request) -> Response:
        self.calls += 1
        review = orjson.loads(await request.body())
        self.users.append(review["request"]["userInfo"])
        patch = base64.b64encode(orjson.dumps([MARK])).decode()
        response = {"uid": review["request"]["uid"], "allowed": True, "patch": patch}
        response["patchType"] = "JSONPatch"
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
        return Response(orjson.dumps(body | {"response": response}))


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def hook(ca: trustme.CA) -> AsyncIterator[tuple[Counter, dict[str, str]]]:
    counter, sock = Counter(), listening_socket("127.0.0.1", 0)
    app = Starlette(routes=[Route("/mutate", counter.handle, methods=["POST"])])
    cert = ca.issue_cert("127.0.0.1")
    with cert.private_key_pem.tempfile() as key, cert.cert_chain_pems[0].tempfile() as chain:
        async with serving(app, sock, ssl_certfile=chain, ssl_keyfile=key):
            bundle = base64.b64encode(ca.cert_pem.bytes()).decode()
            yield counter, {"url": f"{socket_url(sock, 'https')}/mutate", "caBundle": bundle}


@pytest.fixture
def options(hook: tuple[Counter, dict[str, str]]) -> ApiOptions:
    """Depending on the webhook starts it first and stops it last, after the apiserver's client."""
    return ApiOptions()


def configuration(
    client_config: dict[str, str], conditions: list[dict[str, str]], policy: str = "Fail"
) -> dict[str, Any]:
    rule = {"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"]}
    webhook = {
        "name": "pods.webhook.rgpu.io",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": policy,
        "clientConfig": client_config,
        "rules": [rule | {"resources": ["pods"]}],
        "matchConditions": conditions,
    }
    return {"metadata": {"name": "rgpu-extender"}, "webhooks": [webhook]}


async def configure(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], expression: str, **kw: Any
) -> None:
    conditions = [{"name": "selected", "expression": expression}]
    reply = await client.post(CONFIGS, json=configuration(hook[1], conditions, **kw))
    assert reply.status_code == 201, reply.text


def gpu_pod(pod: Manifest, name: str) -> dict[str, Any]:
    body: dict[str, Any] = pod(name)
    limits = {"nvidia.com/remote-gpu": "1"}
    body["spec"]["containers"][0]["resources"] = {"limits": limits}
    return body


def called(created: httpx.Response) -> bool:
    assert created.status_code in (200, 201), created.text
    return bool((created.json()["metadata"].get("labels") or {}).get("webhook") == "called")


async def test_pod_asking_for_the_resource_is_sent_to_the_webhook(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], pod: Manifest
) -> None:
    await configure(client, hook, ASKS)
    assert called(await client.post(PODS, json=gpu_pod(pod, "gpu")))
    assert not called(await client.post(PODS, json=pod("plain")))
    assert hook[0].calls == 1


async def test_pod_asking_through_an_init_container_request_is_sent(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], pod: Manifest
) -> None:
    await configure(client, hook, ASKS)
    body = pod("init")
    init: dict[str, Any] = {"name": "i", "image": "busybox:1.36"}
    init["resources"] = {"limits": {"nvidia.com/remote-gpu-memory": "1024"}}
    body["spec"]["initContainers"] = [init]
    assert called(await client.post(PODS, json=body))


async def test_owned_annotation_sends_a_pod_that_asks_for_nothing(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], pod: Manifest
) -> None:
    await configure(client, hook, ASKS_OR_OWNED)
    forged = pod("forged", metadata={"annotations": {"hami.io/remote-gpu-devices-allocated": "x"}})
    assert called(await client.post(PODS, json=forged))
    assert not called(await client.post(PODS, json=pod("plain")))


async def test_removing_an_owned_annotation_is_sent_through_the_old_object(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], pod: Manifest
) -> None:
    await configure(client, hook, ASKS_OR_OWNED)
    created = await client.post(PODS, json=pod("p", metadata={"annotations": {"rgpu.io/x": "1"}}))
    assert hook[0].calls == 1
    body = created.json()
    body["metadata"]["annotations"] = {}
    body["metadata"]["labels"] = {}
    assert called(await client.put(f"{PODS}/p", json=body))
    assert hook[0].calls == 2


@pytest.mark.parametrize(("policy", "code"), [("Fail", 403), ("Ignore", 201)])
async def test_evaluation_error_follows_the_failure_policy(
    client: httpx.AsyncClient,
    hook: tuple[Counter, dict[str, str]],
    pod: Manifest,
    policy: str,
    code: int,
) -> None:
    await configure(client, hook, "object.spec.missing == 1", policy=policy)
    reply = await client.post(PODS, json=pod("p"))
    assert reply.status_code == code, reply.text
    assert hook[0].calls == 0
    if code == 403:
        message = reply.json()["message"]
        assert message.startswith('pods "p" is forbidden: expression ')
        assert "resulted in error: no such key: missing" in message


@pytest.mark.parametrize(
    "expression",
    [
        "authorizer.group('').resource('pods').check('get').allowed()",
        "object.metadata.name.lowerAscii() == 'p'",
    ],
)
async def test_unsupported_variable_or_function_is_an_error_not_a_match(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], pod: Manifest, expression: str
) -> None:
    await configure(client, hook, expression)
    assert (await client.post(PODS, json=pod("p"))).status_code == 403
    assert hook[0].calls == 0


async def test_a_false_condition_skips_even_when_another_errs(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], pod: Manifest
) -> None:
    conditions = [
        {"name": "errs", "expression": "object.spec.missing == 1"},
        {"name": "false", "expression": "request.operation == 'UPDATE'"},
    ]
    reply = await client.post(CONFIGS, json=configuration(hook[1], conditions))
    assert reply.status_code == 201
    assert not called(await client.post(PODS, json=pod("p")))


async def test_non_boolean_result_is_an_error(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], pod: Manifest
) -> None:
    await configure(client, hook, "object.metadata.name")
    assert (await client.post(PODS, json=pod("p"))).status_code == 403


@pytest.mark.parametrize(
    ("expression", "detail"),
    [
        ("object.spec +", "compilation failed: ERROR: <input>:1:"),
        ("foo(object)", "undeclared reference to 'foo'"),
        ("params.x == 1", "undeclared reference to 'params'"),
    ],
)
async def test_invalid_expression_is_refused_at_create(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], expression: str, detail: str
) -> None:
    conditions = [{"name": "c", "expression": expression}]
    reply = await client.post(CONFIGS, json=configuration(hook[1], conditions))
    assert reply.status_code == 422
    body = reply.json()
    assert body["details"]["causes"][0]["field"] == "webhooks[0].matchConditions[0].expression"
    assert detail in body["message"]


async def test_duplicate_or_missing_condition_names_are_refused(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]]
) -> None:
    conditions = [
        {"name": "a", "expression": "true"},
        {"name": "a", "expression": "true"},
        {"expression": "true"},
    ]
    reply = await client.post(CONFIGS, json=configuration(hook[1], conditions))
    assert reply.status_code == 422
    fields = {c["field"] for c in reply.json()["details"]["causes"]}
    assert fields == {"webhooks[0].matchConditions[1].name", "webhooks[0].matchConditions[2].name"}


async def test_the_expressions_k8s_deploys_are_accepted(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]]
) -> None:
    deployed = yaml.safe_load(K8S_WEBHOOK.read_text())
    for webhook in deployed["webhooks"]:
        webhook["clientConfig"] = hook[1]
    reply = await client.post(CONFIGS, json=deployed)
    assert reply.status_code == 201, reply.text


async def test_request_variable_and_review_carry_a_bearer_accounts_user_info(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], pod: Manifest
) -> None:
    await configure(client, hook, "request.userInfo.username.startsWith('system:serviceaccount:')")
    accounts = "/api/v1/namespaces/default/serviceaccounts"
    await client.post(accounts, json={"metadata": {"name": "robot"}})
    robot = binding_manifest("robot", role="edit", user="system:serviceaccount:default:robot")
    await client.post(BINDINGS, json=robot)
    issued = await client.post(f"{accounts}/robot/token", json={"spec": {}})
    bearer = {"Authorization": f"Bearer {issued.json()['status']['token']}"}
    assert not called(await client.post(PODS, json=pod("by-admin")))
    assert called(await client.post(PODS, json=pod("by-robot"), headers=bearer))
    (user,) = hook[0].users
    assert user["username"] == "system:serviceaccount:default:robot"
    assert "system:serviceaccounts:default" in user["groups"]
    assert user["uid"]


async def test_the_deployed_conditions_skip_the_allocators_own_updates_only(
    client: httpx.AsyncClient, hook: tuple[Counter, dict[str, str]], pod: Manifest
) -> None:
    deployed = yaml.safe_load(K8S_WEBHOOK.read_text())
    # The pods webhook; the other one is for pods/status and pods/ephemeralcontainers.
    webhook = deployed["webhooks"][0]
    deployed["webhooks"] = [webhook]
    webhook["clientConfig"] = hook[1]
    webhook.pop("namespaceSelector", None)
    assert (await client.post(CONFIGS, json=deployed)).status_code == 201
    assert called(await client.post(PODS, json=gpu_pod(pod, "p")))
    account = "system:serviceaccount:rgpu-system:rgpu-allocator"
    await client.post(BINDINGS, json=binding_manifest("allocator", role="edit", user=account))
    allocator = {"X-Sim-User": account}
    patch = {"metadata": {"annotations": {"rgpu.io/booking": "{}"}}}
    merge = {"Content-Type": "application/merge-patch+json"}
    by_allocator = await client.patch(f"{PODS}/p", json=patch, headers=allocator | merge)
    assert by_allocator.status_code == 200, by_allocator.text
    assert hook[0].calls == 1
    by_alice = await client.patch(f"{PODS}/p", json=patch, headers={"X-Sim-User": "alice"} | merge)
    assert by_alice.status_code == 200, by_alice.text
    assert hook[0].calls == 2
