"""Mutating admission against a real TLS webhook server (trustme CA), as kube-apiserver calls it."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson
import pytest
import trustme
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rgpu_kubesim import ApiOptions, SimApiServer, run_apiserver
from rgpu_kubesim.apiserver.admission._admission import CONNECTIONS_PER_WEBHOOK
from rgpu_kubesim.apiserver.endpoints._server import listening_socket, serving, socket_url
from rgpu_testkit import binding_manifest

pytestmark = pytest.mark.anyio

Loader = Callable[[str], Any]
Manifest = Callable[..., dict[str, Any]]
Reply = Callable[[str, dict[str, Any]], dict[str, Any]]
SERVICE_NAME = "remote-gpu-webhook.remote-gpu-system.svc"
CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
PODS = "/api/v1/namespaces/default/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}


def allow(request: dict[str, Any], patch: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    if patch is not None:
        response.update(patch=base64.b64encode(orjson.dumps(patch)).decode(), patchType="JSONPatch")
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "response": response}


@dataclass
class Webhook:
    """A TLS AdmissionReview endpoint whose answers the test chooses."""

    url: str
    ca_bundle: str
    reviews: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    peers: set[tuple[str, int]] = field(default_factory=set)
    reply: Reply = field(default=lambda path, review: allow(review["request"]))

    delay: float = 0.0

    async def handle(self, request: Request) -> Response:
        await anyio.sleep(self.delay)
        review = orjson.loads(await request.body())
        self.reviews.append(review)
        self.paths.append(request.url.path)
        if request.client is not None:
            self.peers.add((request.client.host, request.client.port))
        answer = self.reply(request.url.path, review)
        return Response(orjson.dumps(answer), media_type="application/json")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@contextlib.contextmanager
def _cert_files(ca: trustme.CA) -> Iterator[tuple[str, str]]:
    cert = ca.issue_cert("127.0.0.1", SERVICE_NAME)
    with cert.private_key_pem.tempfile() as key, cert.cert_chain_pems[0].tempfile() as chain:
        yield chain, key


@pytest.fixture
async def webhook(ca: trustme.CA) -> AsyncIterator[Webhook]:
    sock = listening_socket("127.0.0.1", 0)
    hook = Webhook(
        url=socket_url(sock, "https"), ca_bundle=base64.b64encode(ca.cert_pem.bytes()).decode()
    )
    app = Starlette(routes=[Route("/{path:path}", hook.handle, methods=["POST"])])
    with _cert_files(ca) as (chain, key):
        async with serving(app, sock, ssl_certfile=chain, ssl_keyfile=key):
            yield hook


@pytest.fixture
def options(webhook: Webhook) -> ApiOptions:
    address = webhook.url.removeprefix("https://")
    return ApiOptions(service_address_map={"remote-gpu-system/remote-gpu-webhook:443": address})


def _configuration(
    webhook: Webhook,
    *,
    url: str | None = None,
    name: str = "w",
    operations: tuple[str, ...] = ("CREATE",),
    **overrides: Any,
) -> dict[str, Any]:
    hook = {
        "name": "pods.remote-gpu.hami.io",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {"url": url or f"{webhook.url}/mutate", "caBundle": webhook.ca_bundle},
        "rules": [
            {
                "operations": list(operations),
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
            }
        ],
        **overrides,
    }
    return {"metadata": {"name": name}, "webhooks": [hook]}


async def _configure(client: httpx.AsyncClient, config: dict[str, Any]) -> None:
    response = await client.post(CONFIGS, json=config)
    assert response.status_code == 201, response.text


async def test_webhook_patch_is_applied_and_request_has_kubes_shape(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest, fixture: Loader
) -> None:
    patch = fixture("admission-response-patch.decoded.json")
    webhook.reply = lambda path, review: allow(review["request"], patch)
    await _configure(client, _configuration(webhook))
    created = await client.post(PODS, json=pod("trainer-0"))
    assert created.status_code == 201
    stored = created.json()
    assert stored["metadata"]["annotations"] == {"hami.io/webhook-mutated": "true"}
    assert stored["spec"]["schedulerName"] == "rgpu-scheduler"
    request = webhook.reviews[0]["request"]
    reference = fixture("admission-review-pod-create.json")["request"]
    assert request.keys() == reference.keys()
    assert request["kind"] == reference["kind"] and request["resource"] == reference["resource"]
    assert (request["operation"], request["name"], request["namespace"]) == (
        "CREATE",
        "trainer-0",
        "default",
    )
    assert request["userInfo"]["username"] == "kubernetes-admin"
    assert request["object"]["spec"]["schedulerName"] == "default-scheduler"
    assert request["oldObject"] is None and request["dryRun"] is False


async def test_a_webhooks_warnings_reach_the_client_as_warning_headers(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest
) -> None:
    long = "x" * 300

    def warn(path: str, review: dict[str, Any]) -> dict[str, Any]:
        answer = allow(review["request"])
        answer["response"]["warnings"] = ["asks for nvidia.com/remote-gpus", long, 7]
        return answer

    webhook.reply = warn
    await _configure(client, _configuration(webhook))
    created = await client.post(PODS, json=pod("trainer-0"))
    assert created.status_code == 201
    assert created.headers.get_list("Warning") == [
        '299 - "asks for nvidia.com/remote-gpus"',
        f'299 - "{"x" * 256}"',
    ]
    patched = await client.patch(
        f"{PODS}/trainer-0", json={"metadata": {"labels": {"a": "b"}}}, headers=MERGE
    )
    assert patched.headers.get_list("Warning") == []  # the configuration covers CREATE only


async def test_denial_surfaces_the_webhooks_message_and_code(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest, fixture: Loader
) -> None:
    deny = fixture("admission-review-response-deny.json")

    def reply(path: str, review: dict[str, Any]) -> dict[str, Any]:
        deny["response"]["uid"] = review["request"]["uid"]
        return deny

    webhook.reply = reply
    await _configure(client, _configuration(webhook))
    response = await client.post(PODS, json=pod("trainer-0"))
    assert response.status_code == 403
    assert response.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'admission webhook "pods.remote-gpu.hami.io" denied the request: '
        "nvidia.com/remote-gpu must be an integer between 1 and 8",
        "code": 403,
    }
    assert (await client.get(f"{PODS}/trainer-0")).status_code == 404


@pytest.mark.parametrize(("policy", "code"), [("Ignore", 201), ("Fail", 500)])
async def test_unreachable_webhook_follows_failure_policy(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest, policy: str, code: int
) -> None:
    closed = listening_socket("127.0.0.1", 0)
    url = socket_url(closed, "https") + "/mutate"
    closed.close()
    await _configure(client, _configuration(webhook, url=url, failurePolicy=policy))
    response = await client.post(PODS, json=pod("a"))
    assert response.status_code == code
    if code == 500:
        assert response.json()["reason"] == "InternalError"
        assert 'failed calling webhook "pods.remote-gpu.hami.io"' in response.json()["message"]


@pytest.mark.parametrize(("policy", "code"), [("Ignore", 201), ("Fail", 500)])
async def test_webhook_slower_than_its_timeout_follows_failure_policy(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest, policy: str, code: int
) -> None:
    webhook.delay = 1.5
    await _configure(client, _configuration(webhook, timeoutSeconds=1, failurePolicy=policy))
    started = anyio.current_time()
    response = await client.post(PODS, json=pod("a"))
    assert response.status_code == code and anyio.current_time() - started < 1.4
    if code == 500:
        assert "context deadline exceeded" in response.json()["message"]


async def test_certificate_from_another_ca_is_a_call_failure(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest
) -> None:
    config = _configuration(webhook)
    other = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    config["webhooks"][0]["clientConfig"]["caBundle"] = other
    await _configure(client, config)
    response = await client.post(PODS, json=pod("a"))
    assert response.status_code == 500 and "CERTIFICATE_VERIFY_FAILED" in response.json()["message"]
    assert webhook.reviews == []


async def test_service_reference_is_dialled_through_the_address_map(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest, fixture: Loader
) -> None:
    config = fixture("mutating-webhook-configuration.yaml")
    config["webhooks"][0]["clientConfig"]["caBundle"] = webhook.ca_bundle
    await _configure(client, config)
    assert (await client.post(PODS, json=pod("a"))).status_code == 201
    assert len(webhook.reviews) == 1


async def test_unmapped_service_fails_closed_with_a_clear_message(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest
) -> None:
    config = _configuration(webhook)
    config["webhooks"][0]["clientConfig"] = {"service": {"namespace": "x", "name": "y"}}
    await _configure(client, config)
    response = await client.post(PODS, json=pod("a"))
    assert response.status_code == 500
    assert "service x/y:443 is not in ApiOptions.service_address_map" in response.json()["message"]


async def test_namespace_and_object_selectors_choose_what_is_sent(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest, fixture: Loader
) -> None:
    config = fixture("mutating-webhook-configuration.yaml")
    config["webhooks"][0]["clientConfig"]["caBundle"] = webhook.ca_bundle
    await _configure(client, config)
    await client.post(
        "/api/v1/namespaces/kube-system/pods", json=pod("system", namespace="kube-system")
    )
    await client.post(
        PODS, json=pod("opted-out", metadata={"labels": {"hami.io/webhook": "ignore"}})
    )
    await client.post(PODS, json=pod("sent"))
    assert [r["request"]["name"] for r in webhook.reviews] == ["sent"]


async def test_username_comes_from_the_sim_user_header(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    account = "system:serviceaccount:rgpu-system:allocator"
    sim.store.create("rolebindings", binding_manifest("allocator", role="edit", user=account))
    await _configure(client, _configuration(webhook))
    created = await client.post(PODS, json=pod("a"), headers={"X-Sim-User": account})
    assert created.status_code == 201, created.text
    assert (
        webhook.reviews[0]["request"]["userInfo"]["username"]
        == "system:serviceaccount:rgpu-system:allocator"
    )


async def test_update_operations_carry_the_old_object(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    await _configure(client, _configuration(webhook, operations=("UPDATE",)))
    body = orjson.dumps({"metadata": {"annotations": {"x": "y"}}})
    headers = {"Content-Type": "application/merge-patch+json"}
    assert (await client.patch(f"{PODS}/a", content=body, headers=headers)).status_code == 200
    request = webhook.reviews[0]["request"]
    assert request["operation"] == "UPDATE"
    assert request["oldObject"]["metadata"].get("annotations") is None
    assert request["object"]["metadata"]["annotations"] == {"x": "y"}
    assert request["options"]["kind"] == "UpdateOptions"


async def test_response_with_the_wrong_uid_is_a_call_failure(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest
) -> None:
    webhook.reply = lambda path, review: allow({"uid": "not-the-request"})
    await _configure(client, _configuration(webhook))
    response = await client.post(PODS, json=pod("a"))
    assert response.status_code == 500 and "expected response.uid" in response.json()["message"]


async def test_pods_rule_excludes_subresources_and_pods_star_includes_binding(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    config = _configuration(webhook)
    config["webhooks"][0]["rules"][0]["resources"] = ["pods/*"]
    await _configure(client, config)
    await client.post(PODS, json=pod("b"))
    binding = {"metadata": {"name": "a"}, "target": {"kind": "Node", "name": "n"}}
    assert (await client.post(f"{PODS}/a/binding", json=binding)).status_code == 201
    assert [
        (r["request"]["kind"]["kind"], r["request"]["subResource"]) for r in webhook.reviews
    ] == [("Binding", "binding")]


def _status_configuration(webhook: Webhook, resources: list[str]) -> dict[str, Any]:
    config = _configuration(webhook, operations=("UPDATE",))
    config["webhooks"][0]["rules"][0]["resources"] = resources
    return config


async def test_a_pods_status_rule_is_called_for_status_writes_with_the_whole_pod(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    await _configure(client, _status_configuration(webhook, ["pods/status"]))
    body = {"metadata": {"annotations": {"forged": "1"}}, "status": {"phase": "Running"}}
    response = await client.patch(
        f"{PODS}/a/status",
        content=orjson.dumps(body),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text
    assert (await client.patch(f"{PODS}/a", content=b"{}", headers=MERGE)).status_code == 200
    [review] = webhook.reviews
    request = review["request"]
    assert (request["operation"], request["subResource"], request["kind"]["kind"]) == (
        "UPDATE",
        "status",
        "Pod",
    )
    assert request["object"]["metadata"]["annotations"] == {"forged": "1"}
    assert request["oldObject"]["status"]["phase"] == "Pending"


async def test_a_webhook_refusing_a_status_write_keeps_its_metadata_change_out(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    def refuse(path: str, review: dict[str, Any]) -> dict[str, Any]:
        request = review["request"]
        status = {"code": 403, "message": "owned annotations are the scheduler's"}
        answer = {"uid": request["uid"], "allowed": False, "status": status}
        return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "response": answer}

    sim.store.create("pods", pod("a"))
    webhook.reply = refuse
    await _configure(client, _status_configuration(webhook, ["pods/*"]))
    body = {"metadata": {"annotations": {"hami.io/lupine-endpoint": "1.2.3.4:1"}}}
    response = await client.patch(f"{PODS}/a/status", content=orjson.dumps(body), headers=MERGE)
    assert response.status_code == 403
    assert "owned annotations are the scheduler's" in response.json()["message"]
    assert not sim.store.get("pods", "a")["metadata"].get("annotations")


async def test_a_pods_rule_alone_is_not_called_for_status_writes(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    await _configure(client, _status_configuration(webhook, ["pods"]))
    body = {"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}}
    response = await client.patch(f"{PODS}/a/status", content=orjson.dumps(body), headers=MERGE)
    assert response.status_code == 200 and webhook.reviews == []


VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def deny(message: str) -> Reply:
    def reply(path: str, review: dict[str, Any]) -> dict[str, Any]:
        request = review["request"]
        if path != "/validate":
            return allow(request)
        answer = {"uid": request["uid"], "allowed": False, "status": {"message": message}}
        return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "response": answer}

    return reply


async def test_a_validating_webhook_for_pods_status_refuses_the_write_and_nothing_is_stored(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    webhook.reply = deny("hami.io/lupine-endpoint is the scheduler's")
    config = _status_configuration(webhook, ["pods/status"])
    config["webhooks"][0]["clientConfig"]["url"] = f"{webhook.url}/validate"
    response = await client.post(VALIDATING, json=config)
    assert response.status_code == 201, response.text
    assert "reinvocationPolicy" not in response.json()["webhooks"][0]
    body = {"metadata": {"annotations": {"hami.io/lupine-endpoint": "10.0.0.9:14833"}}}
    refused = await client.patch(f"{PODS}/a/status", content=orjson.dumps(body), headers=MERGE)
    assert refused.status_code == 400
    assert refused.json()["message"] == (
        'admission webhook "pods.remote-gpu.hami.io" denied the request: '
        "hami.io/lupine-endpoint is the scheduler's"
    )
    assert not sim.store.get("pods", "a")["metadata"].get("annotations")
    [review] = webhook.reviews
    assert review["request"]["subResource"] == "status"


async def test_validating_webhooks_see_the_object_as_mutating_webhooks_left_it(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest
) -> None:
    def reply(path: str, review: dict[str, Any]) -> dict[str, Any]:
        if path == "/validate":
            return allow(review["request"])
        labelled = [{"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}]
        return allow(review["request"], labelled)

    webhook.reply = reply
    await _configure(client, _configuration(webhook, url=f"{webhook.url}/mutate"))
    validating = _configuration(webhook, url=f"{webhook.url}/validate")
    assert (await client.post(VALIDATING, json=validating)).status_code == 201
    assert (await client.post(PODS, json=pod("a"))).status_code == 201
    assert webhook.paths == ["/mutate", "/validate"]
    assert webhook.reviews[1]["request"]["object"]["metadata"]["labels"] == {"mutated": "yes"}


@pytest.mark.parametrize(("policy", "code"), [("Fail", 500), ("Ignore", 201)])
async def test_a_validating_webhook_that_answers_with_a_patch_is_a_failed_call(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest, policy: str, code: int
) -> None:
    webhook.reply = lambda path, review: allow(review["request"], [{"op": "test", "path": ""}])
    config = _configuration(webhook, url=f"{webhook.url}/validate", failurePolicy=policy)
    assert (await client.post(VALIDATING, json=config)).status_code == 201
    response = await client.post(PODS, json=pod("a"))
    assert response.status_code == code, response.text
    if code == 500:
        assert "validating webhooks may not return response.patch" in response.json()["message"]


async def test_a_validating_configuration_with_a_reinvocation_policy_is_refused_under_strict(
    client: httpx.AsyncClient, webhook: Webhook
) -> None:
    config = _configuration(webhook, reinvocationPolicy="IfNeeded")
    response = await client.post(VALIDATING, params={"fieldValidation": "Strict"}, json=config)
    assert response.status_code == 400
    assert 'unknown field "webhooks[0].reinvocationPolicy"' in response.json()["message"]


async def test_a_burst_of_creations_reuses_at_most_25_connections_to_a_webhook(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    webhook.delay = 0.05
    await _configure(client, _configuration(webhook))

    async def create(name: str) -> None:
        assert (await client.post(PODS, json=pod(name))).status_code == 201

    async with anyio.create_task_group() as tg:
        for i in range(60):
            tg.start_soon(create, f"p{i}")
    assert len(sim.store.list("pods")) == 60 and len(webhook.reviews) == 60
    assert 1 < len(webhook.peers) <= CONNECTIONS_PER_WEBHOOK


async def test_reinvocation_if_needed_runs_an_earlier_webhook_again(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest
) -> None:
    def reply(path: str, review: dict[str, Any]) -> dict[str, Any]:
        request = review["request"]
        if path != "/second":
            return allow(request)
        labelled = [{"op": "add", "path": "/metadata/labels", "value": {"second": "ran"}}]
        return allow(request, labelled)

    webhook.reply = reply
    first = _configuration(
        webhook, name="a-first", url=f"{webhook.url}/first", reinvocationPolicy="IfNeeded"
    )
    second = _configuration(webhook, name="b-second", url=f"{webhook.url}/second")
    second["webhooks"][0]["name"] = "second.remote-gpu.hami.io"
    await _configure(client, first)
    await _configure(client, second)
    created = await client.post(PODS, json=pod("a"))
    assert created.json()["metadata"]["labels"] == {"second": "ran"}
    assert webhook.paths == ["/first", "/second", "/first"]
    assert webhook.reviews[2]["request"]["object"]["metadata"]["labels"] == {"second": "ran"}


async def test_webhook_without_reinvocation_runs_once(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest
) -> None:
    webhook.reply = lambda path, review: allow(
        review["request"],
        [{"op": "add", "path": "/metadata/labels", "value": {"p": path.strip("/")}}],
    )
    await _configure(client, _configuration(webhook, name="a", url=f"{webhook.url}/one"))
    second = _configuration(webhook, name="b", url=f"{webhook.url}/two")
    second["webhooks"][0]["name"] = "two.remote-gpu.hami.io"
    await _configure(client, second)
    created = await client.post(PODS, json=pod("a"))
    assert webhook.paths == ["/one", "/two"]
    assert created.json()["metadata"]["labels"] == {"p": "two"}


def _racing(sim: SimApiServer) -> Reply:
    """A webhook that, the first time it is called, lets another writer change pod "a"."""
    raced: list[bool] = []

    def reply(path: str, review: dict[str, Any]) -> dict[str, Any]:
        if not raced:
            raced.append(True)
            sim.store.patch("pods", "a", {"metadata": {"labels": {"racer": "won"}}})
        return allow(review["request"])

    return reply


async def test_patch_is_reapplied_when_a_write_lands_while_webhooks_run(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    await _configure(client, _configuration(webhook, operations=("UPDATE",)))
    webhook.reply = _racing(sim)
    body = orjson.dumps({"metadata": {"annotations": {"mine": "1"}}})
    headers = {"Content-Type": "application/merge-patch+json"}
    response = await client.patch(f"{PODS}/a", content=body, headers=headers)
    assert response.status_code == 200
    assert response.json()["metadata"]["labels"] == {"racer": "won"}
    assert response.json()["metadata"]["annotations"] == {"mine": "1"}
    assert len(webhook.reviews) == 2


async def test_patch_with_explicit_version_loses_to_a_write_during_admission(
    client: httpx.AsyncClient, sim: SimApiServer, webhook: Webhook, pod: Manifest
) -> None:
    version = sim.store.create("pods", pod("a"))["metadata"]["resourceVersion"]
    await _configure(client, _configuration(webhook, operations=("UPDATE",)))
    webhook.reply = _racing(sim)
    body = orjson.dumps({"metadata": {"resourceVersion": version, "annotations": {"mine": "1"}}})
    headers = {"Content-Type": "application/merge-patch+json"}
    response = await client.patch(f"{PODS}/a", content=body, headers=headers)
    assert response.status_code == 409 and response.json()["reason"] == "Conflict"
    assert "annotations" not in sim.store.get("pods", "a")["metadata"]


async def test_username_comes_from_a_mapped_user_agent_when_no_header_names_one(
    webhook: Webhook, pod: Manifest
) -> None:
    service = "system:serviceaccount:rgpu-system:rgpu-allocator"
    options = ApiOptions(user_agents={"rgpu-allocator": service})
    async with run_apiserver(options=options) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        sim.store.create("rolebindings", binding_manifest("allocator", role="edit", user=service))
        await _configure(client, _configuration(webhook))
        await client.post(PODS, json=pod("a"), headers={"User-Agent": "rgpu-allocator/0.1"})
        await client.post(PODS, json=pod("b"), headers={"User-Agent": "kubectl/v1.32"})
    users = [r["request"]["userInfo"]["username"] for r in webhook.reviews]
    assert users == [service, "kubernetes-admin"]


async def test_dry_run_calls_webhooks_with_dry_run_true_and_stores_nothing(
    client: httpx.AsyncClient, webhook: Webhook, pod: Manifest, fixture: Loader
) -> None:
    patch = fixture("admission-response-patch.decoded.json")
    webhook.reply = lambda path, review: allow(review["request"], patch)
    await _configure(client, _configuration(webhook))
    created = await client.post(PODS, params={"dryRun": "All"}, json=pod("trainer-0"))
    assert created.status_code == 201
    assert created.json()["spec"]["schedulerName"] == "rgpu-scheduler"
    request = webhook.reviews[0]["request"]
    assert request["dryRun"] is True and request["options"]["dryRun"] == ["All"]
    assert (await client.get(f"{PODS}/trainer-0")).status_code == 404
